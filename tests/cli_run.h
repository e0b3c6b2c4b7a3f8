// Runs the diffuse binary as a user would, for the CLI tests: through the shell, stdin from
// /dev/null, stdout captured, stderr through a file in the test's folder.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace diffuse::test {

struct CliRun {
  int exit_code = -1;  // -1 when the process did not exit normally
  std::string out, err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `env` ("NAME=value ...") is put before the command.
inline CliRun run_cli(const std::vector<std::string>& args, const TempDir& dir,
                      const std::string& env = "") {
  std::string cmd = env.empty() ? "" : env + " ";
  cmd += shell_quote(DIFFUSE_CLI_PATH);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  const std::string err_file = dir.file("stderr.txt");
  cmd += " 2>" + shell_quote(err_file) + " </dev/null";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

}  // namespace diffuse::test
