// The client's process-wide hooks: what makes fork() and exit() safe for every live
// SessionHolder (client.h says what a program sees of them; session_holder.h what each
// holder does).
//  - At load time, unless TENSORD_NO_PROCESS_HOOKS=1: GRPC_POLL_STRATEGY=poll and
//    GRPC_ENABLE_FORK_SUPPORT=1 in the environment, when the program did not set them.
//  - Once, when the first holder joins: pthread_atfork handlers (not with the opt-out) that
//    suspend every holder and wait for gRPC to shut down before fork(), falling back to gRPC's
//    own fork hooks when it will not (process_hooks.cc says why), and let each holder go on in
//    the parent or start afresh in the child; and an atexit handler that shuts every holder
//    down before static destructors run.
// Thread-safe.
#pragma once

namespace tensord::internal {

class SessionHolder;

// `holder` takes part in the hooks until LeaveProcessHooks; installs them on first use. Call
// once gRPC is initialised, so the atexit handler runs before gRPC's static destructors.
void JoinProcessHooks(SessionHolder* holder);
void LeaveProcessHooks(SessionHolder* holder);

}  // namespace tensord::internal
