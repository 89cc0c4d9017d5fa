// A small XML document tree built with expat, for S3's response bodies
// (ListBucketResult, DeleteResult, Error). Elements keep their name (with any
// namespace prefix as written), their concatenated character data and their
// children in document order; attributes are dropped. Values only: no shared
// state, any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace weir::objstore::xml {

struct Element {
  std::string name;
  std::string text;  // character data directly inside this element
  std::vector<Element> children;

  // The first child named `child`, or nullptr.
  const Element* Find(std::string_view child) const;
  // The text of the first child named `child`, or "" if there is none.
  std::string_view TextOf(std::string_view child) const;
};

// Parses a whole document; a malformed one (or one nested deeper than 64
// levels) is kCorruption naming expat's error and position.
Result<Element> Parse(std::string_view document);

// Escapes &, <, >, " and ' for use in element text or attribute values.
std::string Escape(std::string_view text);

}  // namespace weir::objstore::xml
