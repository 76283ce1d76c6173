// tensorctl's --json output, written with nlohmann::json: the fields, names, order and units
// of the Python package's dicts (client/python/py_convert.cc), so that a script reading
// `tensorctl --json` and a program calling client.stat() see the same thing. Times are
// seconds with three decimals, a device is [device_type, device_id], 64-bit counts are
// exact integers. Each document is printed compact, on one line (`watch` and `top` print one
// line per event or refresh).
#pragma once

#include "client/cli/session_rates.h"
#include "nlohmann/json.hpp"
#include "tensord/client.h"

namespace tensord::cli {

// Keys stay in the order they are set, as the Python dicts have them.
using Json = nlohmann::ordered_json;

// client.stat()'s description fields, as in Python's info dicts.
Json InfoJson(const TensorInfo& tensor);
// InfoJson, then "holders": one object per session holding a lease.
Json StatJson(const TensorStat& stat);
// client.status(sessions=True); with `rates` (top) each session also has leases_per_s and
// publishes_per_s.
Json StatusJson(const BrokerStatus& status, const RateMap* rates);
// One bounded work queue: {prefix, depth, slots_held, published, producers_waiting, takers_waiting}.
Json QueueJson(const QueueStatus& queue);
// client.watch()'s events: kind, name, generation, and the tensor (null unless bound).
Json WatchEventJson(const WatchEvent& event);

// Writes `document` on one line of stdout. Text that is not UTF-8 (only a path or a name
// from the command line can be) is written with U+FFFD in place of its bad bytes.
void PrintJson(const Json& document);

}  // namespace tensord::cli
