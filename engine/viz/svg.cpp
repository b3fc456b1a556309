#include "viz/svg.hpp"

#include <cmath>
#include <cstdio>

namespace tessera::viz {

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t')
          out += ' ';
        else
          out += c;
    }
  }
  return out;
}

std::string coord(double v) {
  if (!std::isfinite(v)) v = 0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  // Trim trailing zeros: "12.50" -> "12.5", "3.00" -> "3".
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

namespace {

std::string stroke_attrs(const Stroke &s) {
  std::string a = "stroke=\"" + xml_escape(s.color) + "\" stroke-width=\"" + coord(s.width) + "\"";
  if (!s.dash.empty()) a += " stroke-dasharray=\"" + xml_escape(s.dash) + "\"";
  return a;
}

}  // namespace

Svg::Svg(double width, double height, const std::string &title) {
  out_ << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
       << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << coord(width) << "\" height=\""
       << coord(height) << "\" viewBox=\"0 0 " << coord(width) << " " << coord(height)
       << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
       << "<title>" << xml_escape(title) << "</title>\n";
  // An opaque background: viewers with a dark theme and PNG converters
  // would otherwise show black axes on black.
  rect(0, 0, width, height, "#ffffff");
}

void Svg::rect(double x, double y, double w, double h, const std::string &fill,
               const std::string &stroke) {
  out_ << "<rect x=\"" << coord(x) << "\" y=\"" << coord(y) << "\" width=\"" << coord(w)
       << "\" height=\"" << coord(h) << "\" fill=\"" << xml_escape(fill) << "\" stroke=\""
       << xml_escape(stroke) << "\"/>\n";
}

void Svg::line(double x1, double y1, double x2, double y2, const Stroke &s) {
  out_ << "<line x1=\"" << coord(x1) << "\" y1=\"" << coord(y1) << "\" x2=\"" << coord(x2)
       << "\" y2=\"" << coord(y2) << "\" " << stroke_attrs(s) << "/>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>> &pts, const Stroke &s,
                   const std::string &attrs) {
  out_ << "<polyline fill=\"none\" " << stroke_attrs(s)
       << " stroke-linejoin=\"round\" stroke-linecap=\"round\"";
  if (!attrs.empty()) out_ << " " << attrs;
  out_ << " points=\"";
  for (size_t i = 0; i < pts.size(); ++i)
    out_ << (i ? " " : "") << coord(pts[i].first) << "," << coord(pts[i].second);
  out_ << "\"/>\n";
}

void Svg::circle(double cx, double cy, double r, const std::string &fill,
                 const std::string &attrs) {
  out_ << "<circle cx=\"" << coord(cx) << "\" cy=\"" << coord(cy) << "\" r=\"" << coord(r)
       << "\" fill=\"" << xml_escape(fill) << "\"";
  if (!attrs.empty()) out_ << " " << attrs;
  out_ << "/>\n";
}

void Svg::text(double x, double y, const std::string &s, double size, const std::string &anchor,
               const std::string &attrs, double rotate) {
  out_ << "<text x=\"" << coord(x) << "\" y=\"" << coord(y) << "\" font-size=\"" << coord(size)
       << "\" text-anchor=\"" << anchor << "\" fill=\"#222\"";
  if (rotate != 0)
    out_ << " transform=\"rotate(" << coord(rotate) << " " << coord(x) << " " << coord(y) << ")\"";
  if (!attrs.empty()) out_ << " " << attrs;
  out_ << ">" << xml_escape(s) << "</text>\n";
}

void Svg::open_group(const std::string &attrs) {
  out_ << "<g" << (attrs.empty() ? "" : " " + attrs) << ">\n";
}

void Svg::close_group() {
  out_ << "</g>\n";
}

std::string Svg::finish() {
  out_ << "</svg>\n";
  return out_.str();
}

}  // namespace tessera::viz
