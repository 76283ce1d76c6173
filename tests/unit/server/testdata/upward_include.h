// A state/ header that reaches up into daemon/: what the layering check must refuse.
#include "server/daemon/config.h"
#include "server/runtime/executor.h"
