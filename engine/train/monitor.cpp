#include "train/monitor.hpp"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "util/error.hpp"

namespace fs = std::filesystem;

namespace tessera {

namespace {

std::mutex g_mu;
std::map<std::string, config::MonitorSettings> g_by_dir;

// The shortest text that reads back as the same double, as Python's csv
// module writes a float.
std::string number(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// DeepSpeed's csv_monitor: "Train/Samples/train_loss" goes to
// Train_Samples_train_loss.csv with the header "step,train_loss".
std::string csv_file_name(const std::string &tag) {
  std::string f = tag;
  for (char &c : f)
    if (c == '/' || c == ' ') c = '_';
  return f + ".csv";
}

}  // namespace

Monitors::Monitors(const config::MonitorSettings &m)
    : tensorboard_dir_(m.tensorboard_dir), csv_dir_(m.csv_dir) {
  if (!tensorboard_dir_.empty()) tensorboard_ = std::make_unique<EventFileWriter>(tensorboard_dir_);
  if (!csv_dir_.empty()) {
    std::error_code ec;
    fs::create_directories(csv_dir_, ec);
    if (ec)
      throw Error(TSR_ERR_IO, csv_dir_ + ": cannot create the CSV monitor directory (" +
                                  ec.message() + "); check monitor.csv_monitor.output_path");
  }
}

std::string Monitors::describe() const {
  std::string out;
  if (tensorboard_)
    out += "TensorBoard event files in " + tensorboard_dir_ + " (tensorboard --logdir " +
           tensorboard_dir_ + ")";
  if (!csv_dir_.empty()) out += std::string(out.empty() ? "" : "; ") + "CSV files in " + csv_dir_;
  return out;
}

void Monitors::train(int64_t step, double loss, double lr, double samples_per_s) {
  scalar("Train/Samples/train_loss", loss, step);
  scalar("Train/Samples/lr", lr, step);
  scalar("Train/Samples/samples_per_s", samples_per_s, step);
}

void Monitors::eval(int64_t step, double loss, double accuracy) {
  scalar("Eval/Samples/eval_loss", loss, step);
  if (accuracy >= 0) scalar("Eval/Samples/eval_accuracy", accuracy, step);
}

void Monitors::scalar(const std::string &tag, double value, int64_t step) {
  if (tensorboard_) tensorboard_->add_scalar(tag, value, step);
  if (!csv_dir_.empty()) csv_row(tag, value, step);
}

void Monitors::csv_row(const std::string &tag, double value, int64_t step) {
  const fs::path file = fs::path(csv_dir_) / csv_file_name(tag);
  // A resumed run appends to the files of the first; the header goes in
  // once, when the file is new.
  bool header = false;
  if (csv_files_.insert(file.string()).second) {
    std::error_code ec;
    header = !fs::exists(file, ec) || fs::file_size(file, ec) == 0;
  }
  std::ofstream out(file, std::ios::app);
  if (header) out << "step," << tag.substr(tag.rfind('/') + 1) << "\n";
  out << step << "," << number(value) << "\n";
  if (!out) throw Error(TSR_ERR_IO, file.string() + ": write failed");
}

void set_run_monitors(const std::string &run_dir, const config::MonitorSettings &m) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_by_dir[run_dir] = m;
}

std::optional<config::MonitorSettings> run_monitors(const std::string &run_dir) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_by_dir.find(run_dir);
  if (it == g_by_dir.end()) return std::nullopt;
  return it->second;
}

}  // namespace tessera
