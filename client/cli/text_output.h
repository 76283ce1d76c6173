// tensorctl's human output: the words and tables people read (--json has json_output.h).
// Scripts should not parse these; tests check a few lines of them, so their shape is kept.
// Functions that print write to stdout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "client/cli/session_rates.h"
#include "tensord/client.h"

namespace tensord::cli {

// "(2, 3)", "(5,)", "()": as numpy prints a shape.
std::string ShapeText(const std::vector<int64_t>& dims);
// "float32"; "code3x64" for a dtype tensord has no name for.
std::string DTypeText(DLDataType dtype);
// "4.0 MiB" (common::HumanBytes).
std::string BytesText(uint64_t bytes);
// Milliseconds since the epoch as local time, "2026-11-23 20:05:51.123 +0000".
std::string LocalTimeText(int64_t unix_ms);
// "bound", "unbound", "reset".
const char* WatchKindText(WatchEvent::Kind kind);

// Everything about one tensor, a "field  value" line each (stat, get without -o).
void PrintInfoHuman(const TensorInfo& tensor);

// Rows with each column padded to its widest cell; the first row is the heading.
void PrintTable(const std::vector<std::vector<std::string>>& rows);

// The sessions table of `status` and `top`: the sessions holding the most memory first, at
// most `max_rows` of them; with `rates` (top after its first sample) two rate columns.
void PrintSessions(const BrokerStatus& status, const RateMap* rates, size_t max_rows);

}  // namespace tensord::cli
