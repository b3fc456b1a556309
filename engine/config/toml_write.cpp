// Writing configs back as TOML the way a person would: double-quoted
// strings, the shortest decimal that reads back to the same double, keys
// before sub-sections.
#include <charconv>
#include <cmath>
#include <sstream>

#include "config/config.hpp"

namespace tessera::config {

namespace {

std::string quote(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string key(const std::string &k) {
  bool bare = !k.empty();
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) bare = false;
  return bare ? k : quote(k);
}

std::string number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest round-trip
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string value(const toml::node &n);

std::string inline_table(const toml::table &t) {
  std::string out = "{ ";
  bool first = true;
  for (const auto &[k, v] : t) {
    out += (first ? "" : ", ") + key(std::string(k.str())) + " = " + value(v);
    first = false;
  }
  return out + (first ? "}" : " }");
}

std::string value(const toml::node &n) {
  if (auto *s = n.as_string()) return quote(s->get());
  if (auto *i = n.as_integer()) return std::to_string(i->get());
  if (auto *f = n.as_floating_point()) return number(f->get());
  if (auto *b = n.as_boolean()) return b->get() ? "true" : "false";
  if (auto *a = n.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + value(*a->get(i));
    return out + "]";
  }
  if (auto *t = n.as_table()) return inline_table(*t);
  std::ostringstream os;
  n.visit([&](const auto &v) { os << v; });
  return os.str();
}

void write_table(std::ostringstream &os, const toml::table &t, const std::string &prefix) {
  bool wrote_header = prefix.empty();
  bool has_scalars = false;
  for (const auto &[k, v] : t)
    if (!v.is_table()) has_scalars = true;
  if (!prefix.empty() && has_scalars) {
    os << "\n[" << prefix << "]\n";
    wrote_header = true;
  }
  for (const auto &[k, v] : t)
    if (!v.is_table()) os << key(std::string(k.str())) << " = " << value(v) << "\n";
  (void)wrote_header;
  for (const auto &[k, v] : t)
    if (v.is_table())
      write_table(
          os, *v.as_table(),
          prefix.empty() ? key(std::string(k.str())) : prefix + "." + key(std::string(k.str())));
}

}  // namespace

std::string to_toml(const toml::table &t) {
  std::ostringstream os;
  write_table(os, t, "");
  std::string s = os.str();
  while (!s.empty() && s.front() == '\n') s.erase(s.begin());
  return s;
}

}  // namespace tessera::config
