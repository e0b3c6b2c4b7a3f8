#include "text/bpe_merges.h"

#include <set>

namespace diffuse::text {

std::vector<BpeMerge> learn_bpe_merges(const BpeWordCounts& words, int num_merges,
                                       std::vector<std::string>& tokens) {
  std::set<std::string> known(tokens.begin(), tokens.end());
  std::vector<std::pair<std::vector<std::string>, int64_t>> work(words.begin(), words.end());
  std::vector<BpeMerge> merges;
  for (int m = 0; m < num_merges; ++m) {
    // Recounted from scratch each round: simple, and fast enough for the small corpora the
    // project trains on (one word list, a few hundred merges).
    std::map<BpeMerge, int64_t> pairs;
    for (const auto& [syms, count] : work)
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += count;
    const BpeMerge* best = nullptr;
    int64_t best_count = 1;
    for (const auto& [pair, count] : pairs)
      if (count > best_count) best = &pair, best_count = count;
    if (!best) break;
    const BpeMerge pair = *best;
    const std::string merged = pair.first + pair.second;
    merges.push_back(pair);
    if (known.insert(merged).second) tokens.push_back(merged);
    for (auto& [syms, count] : work) {
      std::vector<std::string> out;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == pair.first && syms[i + 1] == pair.second) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      syms.swap(out);
    }
  }
  return merges;
}

}  // namespace diffuse::text
