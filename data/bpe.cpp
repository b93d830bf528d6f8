// Byte-level BPE: training with incremental pair counts, encoding by merge
// rank, and the JSON file format.
#include <algorithm>
#include <map>
#include <queue>
#include <unordered_set>

#include <fmt/format.h>

#include "data/json_file.h"
#include "data/tokenizer.h"

namespace tg::data {

namespace {

enum class ByteClass { space, letter, digit, other };

ByteClass byte_class(unsigned char c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return ByteClass::space;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return ByteClass::letter;
  if (c >= '0' && c <= '9') return ByteClass::digit;
  return ByteClass::other;
}

ByteClass class_at(std::string_view s, size_t i) { return byte_class(static_cast<unsigned char>(s[i])); }

uint64_t pair_key(int64_t a, int64_t b) { return static_cast<uint64_t>(a) << 32 | static_cast<uint64_t>(b); }

constexpr int64_t kBytes = 256;
constexpr const char* kPretokenizer = "chunks-v1";  // names the rule of bpe_chunks, stored in the file

}  // namespace

std::vector<std::string_view> bpe_chunks(std::string_view s) {
  std::vector<std::string_view> chunks;
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    if (class_at(s, i) == ByteClass::space) {
      size_t j = i;
      while (j < n && class_at(s, j) == ByteClass::space) ++j;
      // A final space before a non-space chunk belongs to that chunk.
      if (j < n && s[j - 1] == ' ') --j;
      if (j > i) {
        chunks.push_back(s.substr(i, j - i));
        i = j;
        continue;
      }
    }
    size_t k = s[i] == ' ' ? i + 1 : i;  // at most one leading space
    ByteClass c = class_at(s, k);
    size_t j = k + 1;
    while (j < n && class_at(s, j) == c) ++j;
    chunks.push_back(s.substr(i, j - i));
    i = j;
  }
  return chunks;
}

BPETokenizer::BPETokenizer(std::vector<Pair> merges) : merges_(std::move(merges)) {
  bytes_.reserve(kBytes + merges_.size());
  for (int64_t b = 0; b < kBytes; ++b) bytes_.emplace_back(1, static_cast<char>(b));
  const int64_t max_bytes = max_token_bytes(static_cast<int64_t>(merges_.size()));
  int64_t total = kBytes;
  for (size_t i = 0; i < merges_.size(); ++i) {
    auto [a, b] = merges_[i];
    const int64_t limit = kBytes + static_cast<int64_t>(i);
    if (a < 0 || b < 0 || a >= limit || b >= limit)
      throw ValueError(fmt::format("BPETokenizer: merge {} ({}, {}) must join existing tokens (ids below {})", i, a, b,
                                   limit));
    if (!rank_.emplace(pair_key(a, b), static_cast<int64_t>(i)).second)
      throw ValueError(fmt::format("BPETokenizer: merge {} ({}, {}) repeats merge {}", i, a, b, rank_[pair_key(a, b)]));
    // Checked before the token is built: the sum cannot overflow, as each
    // token is at most max_bytes long.
    total += static_cast<int64_t>(bytes_[a].size() + bytes_[b].size());
    if (total > max_bytes)
      throw ValueError(fmt::format("BPETokenizer: merge {} ({}, {}) makes the tokens total {} bytes, above the limit of "
                                   "{} for {} merges (1 MiB + 64 bytes a merge)", i, a, b, total, max_bytes,
                                   merges_.size()));
    bytes_.push_back(bytes_[a] + bytes_[b]);
  }
}

BPETokenizer BPETokenizer::train(std::string_view text, int64_t vocab_size) {
  if (vocab_size < kBytes)
    throw ValueError(fmt::format("BPETokenizer::train: vocab_size {} is below the {} byte tokens", vocab_size, kBytes));
  // Words: the distinct chunks (sorted, so nothing depends on hash order) with their counts.
  std::map<std::string_view, int64_t> chunk_counts;
  for (std::string_view c : bpe_chunks(text)) ++chunk_counts[c];
  std::vector<std::vector<int64_t>> words;
  std::vector<int64_t> freq;
  for (auto& [chunk, count] : chunk_counts) {
    words.emplace_back(chunk.begin(), chunk.end());
    for (auto& id : words.back()) id = static_cast<unsigned char>(id);
    freq.push_back(count);
  }

  // pair -> occurrences weighted by word counts, and pair -> words that may
  // hold it (stale entries are skipped when used). A merge only touches the
  // words that hold its pair.
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t k = pair_key(words[w][i], words[w][i + 1]);
      pair_count[k] += freq[w];
      auto& list = where[k];
      if (list.empty() || list.back() != static_cast<int32_t>(w)) list.push_back(static_cast<int32_t>(w));
    }

  // Max-heap on (count, then smallest key); entries go stale when a count
  // changes and are dropped when popped.
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Entry> heap;
  for (auto& [k, c] : pair_count) heap.push({c, k});

  std::vector<Pair> merges;
  std::unordered_set<uint64_t> changed;
  while (static_cast<int64_t>(merges.size()) < vocab_size - kBytes) {
    while (!heap.empty() && pair_count[heap.top().key] != heap.top().count) heap.pop();
    if (heap.empty() || heap.top().count < 2) break;  // no pair occurs twice: further merges only memorise
    const uint64_t key = heap.top().key;
    heap.pop();
    const int64_t a = static_cast<int64_t>(key >> 32), b = static_cast<int64_t>(key & 0xffffffffu);
    const int64_t id = kBytes + static_cast<int64_t>(merges.size());
    merges.emplace_back(a, b);

    std::vector<int32_t> affected = std::move(where[key]);
    where.erase(key);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    changed.clear();
    for (int32_t w : affected) {
      std::vector<int64_t>& word = words[w];
      std::vector<int64_t> merged;
      merged.reserve(word.size());
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == a && word[i + 1] == b) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(word[i]);
        }
      }
      if (merged.size() == word.size()) continue;  // stale entry: the pair left this word earlier
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        uint64_t k = pair_key(word[i], word[i + 1]);
        pair_count[k] -= freq[w];
        changed.insert(k);
      }
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        uint64_t k = pair_key(merged[i], merged[i + 1]);
        pair_count[k] += freq[w];
        changed.insert(k);
        if (merged[i] == id || merged[i + 1] == id) {
          auto& list = where[k];
          if (list.empty() || list.back() != w) list.push_back(w);
        }
      }
      word = std::move(merged);
    }
    for (uint64_t k : changed)
      if (int64_t c = pair_count[k]; c > 0) heap.push({c, k});
  }
  return BPETokenizer(std::move(merges));
}

void BPETokenizer::encode_chunk(std::string_view chunk, std::vector<int64_t>& out) const {
  std::vector<int64_t> sym(chunk.begin(), chunk.end());
  for (auto& s : sym) s = static_cast<unsigned char>(s);
  // Apply merges in the order they were learned: always the lowest-ranked
  // adjacent pair first, every occurrence of it at once.
  while (sym.size() > 1) {
    int64_t best = -1;
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      if (auto it = rank_.find(pair_key(sym[i], sym[i + 1])); it != rank_.end() && (best < 0 || it->second < best))
        best = it->second;
    if (best < 0) break;
    auto [a, b] = merges_[best];
    size_t o = 0;
    for (size_t i = 0; i < sym.size(); ++i, ++o) {
      if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
        sym[o] = kBytes + best;
        ++i;
      } else {
        sym[o] = sym[i];
      }
    }
    sym.resize(o);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

std::vector<int64_t> BPETokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 2);
  // Text repeats its words: encode each distinct chunk once.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;  // chunk -> (start, length) in ids
  for (std::string_view c : bpe_chunks(text)) {
    if (auto it = seen.find(c); it != seen.end()) {
      auto [start, len] = it->second;
      for (size_t i = 0; i < len; ++i) ids.push_back(ids[start + i]);
      continue;
    }
    size_t start = ids.size();
    encode_chunk(c, ids);
    seen.emplace(c, std::pair{start, ids.size() - start});
  }
  return ids;
}

std::string BPETokenizer::token(int64_t id) const {
  if (id < 0 || id >= vocab_size())
    throw IndexError(fmt::format("BPETokenizer: token id {} is out of range for vocabulary size {}", id, vocab_size()));
  return bytes_[id];
}

std::string BPETokenizer::decode(std::span<const int64_t> ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw IndexError(fmt::format("BPETokenizer::decode: token id {} is out of range for vocabulary size {}", id,
                                   vocab_size()));
    out += bytes_[id];
  }
  return out;
}

void BPETokenizer::save(const std::string& path) const {
  nlohmann::json merges = nlohmann::json::array();
  for (auto [a, b] : merges_) merges.push_back({a, b});
  write_json_file(path, {{"type", "bpe"}, {"version", 1}, {"pretokenizer", kPretokenizer}, {"merges", merges}},
                  "BPETokenizer::save");
}

BPETokenizer BPETokenizer::load(const std::string& path) {
  return bpe_tokenizer_from_json(read_json_file(path, "BPETokenizer::load"), path);
}

BPETokenizer bpe_tokenizer_from_json(const nlohmann::json& j, const std::string& path) {
  using Pair = BPETokenizer::Pair;
  const char* who = "BPETokenizer::load";
  check_tokenizer_header(j, "bpe", path, who);
  if (const auto& pre = json_field(j, "pretokenizer", path, who); pre != kPretokenizer)
    throw DataError(fmt::format("{}: {}: field 'pretokenizer' is {}, expected \"{}\"", who, path, pre.dump(),
                                kPretokenizer));
  const auto& m = json_field(j, "merges", path, who);
  if (!m.is_array()) throw DataError(fmt::format("{}: {}: field 'merges' must be an array of [left, right] pairs", who, path));
  std::vector<Pair> merges;
  merges.reserve(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    const auto& p = m[i];
    const int64_t limit = kBytes + static_cast<int64_t>(i);
    bool ok = p.is_array() && p.size() == 2 && p[0].is_number_integer() && p[1].is_number_integer() &&
              p[0].get<int64_t>() >= 0 && p[1].get<int64_t>() >= 0 && p[0].get<int64_t>() < limit &&
              p[1].get<int64_t>() < limit;
    if (!ok)
      throw DataError(fmt::format("{}: {}: field 'merges[{}]' is {}, expected a pair of token ids below {}", who, path,
                                  i, p.dump(), limit));
    merges.emplace_back(p[0].get<int64_t>(), p[1].get<int64_t>());
  }
  try {
    return BPETokenizer(std::move(merges));
  } catch (const ValueError& e) {  // a repeated merge, or the tokens' bytes above the limit
    throw DataError(fmt::format("{}: {}: {}", who, path, e.what()));
  }
}

}  // namespace tg::data
