#include <tapegrad/version.h>

namespace tg {

const char* version() { return TAPEGRAD_VERSION; }

}  // namespace tg
