// XML to a tree with expat's push parser (see xml.h).
#include "objstore/xml.h"

#include <expat.h>

#include <memory>

namespace weir::objstore::xml {

namespace {

constexpr size_t kMaxDepth = 64;
// A ListObjectsV2 page of 1,000 keys has about 10,000 elements; a tree node
// costs about 90 bytes however short its tag, so the count is bounded too.
constexpr size_t kMaxElements = 200000;

// Parser state: open elements on a stack; a closed element moves into its
// parent (or becomes the root).
struct Builder {
  XML_Parser parser = nullptr;
  std::vector<Element> open;
  Element root;
  bool have_root = false;
  bool too_deep = false;
  bool too_many = false;
  size_t elements = 0;
  bool has_dtd = false;  // S3 sends none; its entities could expand a small body a hundredfold
  bool out_of_memory = false;  // no exception crosses expat's C frames: recorded, and the parse stopped
};

template <typename Fn>
void Guarded(Builder* b, Fn&& fn) noexcept {
  if (b->out_of_memory) return;
  try {
    fn();
  } catch (...) {
    b->out_of_memory = true;
    XML_StopParser(b->parser, XML_FALSE);
  }
}

void XMLCALL OnStart(void* data, const XML_Char* name, const XML_Char** /*attributes*/) {
  auto* b = static_cast<Builder*>(data);
  if (b->open.size() >= kMaxDepth) {
    b->too_deep = true;
    XML_StopParser(b->parser, XML_FALSE);
    return;
  }
  if (++b->elements > kMaxElements) {
    b->too_many = true;
    XML_StopParser(b->parser, XML_FALSE);
    return;
  }
  Guarded(b, [&] { b->open.push_back(Element{name, {}, {}}); });
}

void XMLCALL OnEnd(void* data, const XML_Char* /*name*/) {
  auto* b = static_cast<Builder*>(data);
  if (b->open.empty()) return;  // its start was refused (too deep, out of memory)
  Guarded(b, [&] {
    Element done = std::move(b->open.back());
    b->open.pop_back();
    if (b->open.empty()) {
      b->root = std::move(done);
      b->have_root = true;
    } else {
      b->open.back().children.push_back(std::move(done));
    }
  });
}

void XMLCALL OnText(void* data, const XML_Char* s, int len) {
  auto* b = static_cast<Builder*>(data);
  if (!b->open.empty()) Guarded(b, [&] { b->open.back().text.append(s, static_cast<size_t>(len)); });
}

void XMLCALL OnDoctype(void* data, const XML_Char* /*name*/, const XML_Char* /*sysid*/, const XML_Char* /*pubid*/,
                       int /*has_internal_subset*/) {
  auto* b = static_cast<Builder*>(data);
  b->has_dtd = true;
  XML_StopParser(b->parser, XML_FALSE);
}

struct ParserFree {
  void operator()(XML_Parser p) const { XML_ParserFree(p); }
};

}  // namespace

const Element* Element::Find(std::string_view child) const {
  for (const Element& e : children) {
    if (e.name == child) return &e;
  }
  return nullptr;
}

std::string_view Element::TextOf(std::string_view child) const {
  const Element* e = Find(child);
  return e ? std::string_view(e->text) : std::string_view();
}

Result<Element> Parse(std::string_view document) {
  std::unique_ptr<std::remove_pointer_t<XML_Parser>, ParserFree> parser(XML_ParserCreate("UTF-8"));
  if (!parser) return ResourceExhausted("cannot create an XML parser");
  Builder b;
  b.parser = parser.get();
  XML_SetUserData(parser.get(), &b);
  XML_SetElementHandler(parser.get(), OnStart, OnEnd);
  XML_SetCharacterDataHandler(parser.get(), OnText);
  XML_SetStartDoctypeDeclHandler(parser.get(), OnDoctype);
  if (document.size() > static_cast<size_t>(INT32_MAX)) return Corruption("XML document too large");
  const XML_Status st = XML_Parse(parser.get(), document.data(), static_cast<int>(document.size()), XML_TRUE);
  if (b.out_of_memory) return ResourceExhausted("out of memory parsing an XML document");
  if (b.too_deep) return Corruption("XML document nested deeper than {} elements", kMaxDepth);
  if (b.too_many) return Corruption("XML document with more than {} elements", kMaxElements);
  if (b.has_dtd) return Corruption("XML document with a DTD (S3 sends none)");
  if (st != XML_STATUS_OK) {
    return Corruption("malformed XML at line {} column {}: {}", XML_GetCurrentLineNumber(parser.get()),
                      XML_GetCurrentColumnNumber(parser.get()), XML_ErrorString(XML_GetErrorCode(parser.get())));
  }
  if (!b.have_root) return Corruption("XML document has no root element");
  return std::move(b.root);
}

std::string Escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace weir::objstore::xml
