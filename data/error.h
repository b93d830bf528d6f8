#pragma once
// DataError: a corpus, text or tokenizer file that cannot be used. A ValueError,
// so callers that catch tg::ValueError see it; the message names the file and
// the place in it (line, byte offset or JSON field) and says what was expected.
#include "../autograd/error.h"

namespace tg::data {

struct DataError : ValueError { using ValueError::ValueError; };

}  // namespace tg::data
