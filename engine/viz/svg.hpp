// A small SVG writer: just the elements the plots need, escaped properly.
// Written by hand so that plotting a run needs no library and no Python.
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::viz {

// Text made safe for XML character data and attribute values.
std::string xml_escape(std::string_view s);

struct Stroke {
  std::string color = "#000";
  double width = 1;
  std::string dash;  // SVG stroke-dasharray, "" for solid
};

class Svg {
 public:
  Svg(double width, double height, const std::string &title);

  void rect(double x, double y, double w, double h, const std::string &fill,
            const std::string &stroke = "none");
  void line(double x1, double y1, double x2, double y2, const Stroke &s);
  // `attrs` are extra attributes, already formatted (`data-x="..."`).
  void polyline(const std::vector<std::pair<double, double>> &pts, const Stroke &s,
                const std::string &attrs = "");
  void circle(double cx, double cy, double r, const std::string &fill,
              const std::string &attrs = "");
  // anchor: start | middle | end. `rotate` turns it about (x, y) in degrees.
  void text(double x, double y, const std::string &s, double size, const std::string &anchor,
            const std::string &attrs = "", double rotate = 0);
  void open_group(const std::string &attrs);
  void close_group();

  std::string finish();

 private:
  std::ostringstream out_;
};

// A number formatted as an SVG coordinate (short, locale-free).
std::string coord(double v);

}  // namespace tessera::viz
