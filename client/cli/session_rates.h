// SessionRates: what `tensorctl top` works out between two samples of the broker's status,
// per session, for its table and its JSON lines. Plain values.
#pragma once

#include <cstdint>
#include <map>

namespace tensord::cli {

struct SessionRates {
  double leases_per_s = 0;
  double publishes_per_s = 0;
};

// By session id; a session without an entry (new since the last sample) shows zeros.
using RateMap = std::map<uint64_t, SessionRates>;

}  // namespace tensord::cli
