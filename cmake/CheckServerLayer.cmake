# Run at build time (server/CMakeLists.txt, tensord_server_layer): fails the build when a file
# of one server layer includes a header of a layer it may not use, i.e. one above it or
# beside it, or a server header outside every layer folder.
#   -DLAYER=broker  -DALLOWED="runtime;access;..."  -DFILES="a.h;b.cc"  -DSTAMP=file  [-DROOT=dir]
# ALLOWED is the layer's dependencies with theirs (the closure); a layer may use itself.
cmake_minimum_required(VERSION 3.22)
set(_errors "")
foreach(_file IN LISTS FILES)
  set(_name "${_file}")
  if(ROOT)
    file(RELATIVE_PATH _name "${ROOT}" "${_file}")
  endif()
  file(STRINGS "${_file}" _includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"server/")
  foreach(_line IN LISTS _includes)
    string(REGEX MATCH "\"server/([^\"]*)\"" _ "${_line}")
    set(_path "${CMAKE_MATCH_1}")
    if(_path MATCHES "^([a-z_]+)/[^/]+$")
      set(_used "${CMAKE_MATCH_1}")
      if(NOT _used STREQUAL LAYER AND NOT _used IN_LIST ALLOWED)
        string(REPLACE ";" ", " _may "${ALLOWED}")
        string(APPEND _errors "${_name}: includes server/${_path}, but server/${LAYER}/ may use only "
                              "itself and ${_may} (server/CMakeLists.txt)\n")
      endif()
    else()
      string(APPEND _errors "${_name}: includes server/${_path}, which is in no layer folder\n")
    endif()
  endforeach()
endforeach()
if(_errors)
  # NOTICE prints the lines as they are; FATAL_ERROR would re-wrap them.
  message(NOTICE "${_errors}")
  message(FATAL_ERROR "server layering: the includes above cross a layer boundary")
endif()
if(STAMP)
  file(WRITE "${STAMP}" "${LAYER}\n")
endif()
