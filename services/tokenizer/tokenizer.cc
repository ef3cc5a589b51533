// Loading tokenizer.json and the encode/decode pipeline. The steps follow HF `tokenizers`:
// split out added tokens, NFC-normalize the rest, Split regex (Isolated), byte-level, BPE.
#include "services/tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/tokenizer/added_tokens.h"
#include "services/tokenizer/bpe.h"
#include "services/tokenizer/pre_tokenizer.h"

namespace cascade::tokenizer {

using internal::AddedToken;
using internal::AddedTokenSplitter;
using internal::BpeModel;
using internal::Segment;
using internal::SplitRegex;
using json = nlohmann::json;

namespace {

// What GPT-2-style ByteLevel pre-tokenizers with use_regex=true split on.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::Status Unsupported(absl::string_view what, const json& j) {
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported tokenizer.json ", what, ": ", j.dump().substr(0, 200)));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<BpeModel> bpe;
  bool nfc = false;
  std::vector<std::unique_ptr<SplitRegex>> splits;  // applied in order, each refining pieces
  std::vector<AddedToken> added;
  std::unique_ptr<AddedTokenSplitter> raw_splitter;         // non-normalized added tokens
  std::unique_ptr<AddedTokenSplitter> normalized_splitter;  // normalized ones
  std::vector<std::string> id_bytes;                        // [vocab_size] raw bytes of each id
  std::vector<uint8_t> id_kind;  // [vocab_size] kNone, kVocab, kAdded, kSpecial
  int32_t eos_id = -1;

  static constexpr uint8_t kNone = 0, kVocab = 1, kAdded = 2, kSpecial = 3;

  absl::Status ParseNormalizer(const json& n);
  absl::Status ParsePreTokenizer(const json& p);
  absl::Status EncodeText(std::string_view text, std::vector<int32_t>* ids) const;
};

absl::Status Tokenizer::Impl::ParseNormalizer(const json& n) {
  if (n.is_null()) return absl::OkStatus();
  const std::string type = n.value("type", "");
  if (type == "NFC") {
    nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence" && n.contains("normalizers")) {
    for (const json& child : n["normalizers"]) {
      if (absl::Status s = ParseNormalizer(child); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return Unsupported("normalizer", n);
}

absl::Status Tokenizer::Impl::ParsePreTokenizer(const json& p) {
  if (p.is_null()) return absl::OkStatus();
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const json& child : p.at("pretokenizers")) {
      if (absl::Status s = ParsePreTokenizer(child); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::string pattern;
  if (type == "Split") {
    const json& pat = p.at("pattern");
    if (!pat.contains("Regex") || p.value("behavior", "") != "Isolated" ||
        p.value("invert", false)) {
      return Unsupported("Split pre-tokenizer", p);
    }
    pattern = pat["Regex"].get<std::string>();
  } else if (type == "ByteLevel") {
    // The byte-level mapping itself happens implicitly: this implementation works on raw bytes.
    if (p.value("add_prefix_space", false)) return Unsupported("ByteLevel add_prefix_space", p);
    if (!p.value("use_regex", true)) return absl::OkStatus();
    pattern = kGpt2Pattern;
  } else {
    return Unsupported("pre_tokenizer", p);
  }
  absl::StatusOr<std::unique_ptr<SplitRegex>> re = SplitRegex::Compile(pattern);
  if (!re.ok()) return re.status();
  splits.push_back(*std::move(re));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  absl::StatusOr<std::string> tok = ReadFile(dir + "/tokenizer.json");
  if (!tok.ok()) return tok.status();
  absl::StatusOr<std::string> config = ReadFile(dir + "/tokenizer_config.json");
  if (!config.ok() && !absl::IsNotFound(config.status())) return config.status();
  return FromJson(*tok, config.ok() ? *config : std::string());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json) {
  auto impl = std::make_unique<Impl>();
  try {
    const json root = json::parse(tokenizer_json);
    const json& model = root.at("model");
    if (model.value("type", "BPE") != "BPE") return Unsupported("model", model["type"]);
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        model["dropout"].get<double>() > 0) {
      return Unsupported("BPE dropout", model["dropout"]);
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
        return Unsupported(key, model[key]);
    }
    absl::flat_hash_map<std::string, int32_t> vocab;
    int32_t max_id = -1;
    for (const auto& [spelled, id_json] : model.at("vocab").items()) {
      std::optional<std::string> bytes = internal::ByteLevelToBytes(spelled);
      if (!bytes) return Unsupported("vocab entry outside the byte-level alphabet", spelled);
      const auto id = id_json.get<int32_t>();
      if (id < 0) return Unsupported("negative id", id_json);
      max_id = std::max(max_id, id);
      vocab.emplace(*std::move(bytes), id);
    }
    std::vector<std::pair<std::string, std::string>> merges;
    for (const json& m : model.at("merges")) {
      std::string left, right;
      if (m.is_string()) {  // older format: "left right"
        const auto s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          return Unsupported("merge", m);
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2) {  // newer format: ["left", "right"]
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return Unsupported("merge", m);
      }
      std::optional<std::string> l = internal::ByteLevelToBytes(left);
      std::optional<std::string> r = internal::ByteLevelToBytes(right);
      if (!l || !r) return Unsupported("merge outside the byte-level alphabet", m);
      merges.emplace_back(*std::move(l), *std::move(r));
    }
    impl->id_bytes.resize(static_cast<size_t>(max_id + 1));
    impl->id_kind.assign(static_cast<size_t>(max_id + 1), Impl::kNone);
    for (const auto& [bytes, id] : vocab) {
      impl->id_bytes[id] = bytes;
      impl->id_kind[id] = Impl::kVocab;
    }
    absl::StatusOr<std::unique_ptr<BpeModel>> bpe =
        BpeModel::Create(std::move(vocab), merges, model.value("ignore_merges", false));
    if (!bpe.ok()) return bpe.status();
    impl->bpe = *std::move(bpe);

    if (absl::Status s = impl->ParseNormalizer(root.value("normalizer", json())); !s.ok()) return s;
    if (absl::Status s = impl->ParsePreTokenizer(root.value("pre_tokenizer", json())); !s.ok())
      return s;
    if (const json d = root.value("decoder", json());
        !d.is_null() && d.value("type", "") != "ByteLevel")
      return Unsupported("decoder", d);

    for (const json& a : root.value("added_tokens", json::array())) {
      if (a.value("single_word", false)) return Unsupported("single_word added token", a);
      AddedToken t;
      t.content = a.at("content").get<std::string>();
      t.id = a.at("id").get<int32_t>();
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.normalized = a.value("normalized", false);
      t.special = a.value("special", false);
      if (t.id < 0 || t.content.empty() || !IsValidUtf8(t.content))
        return Unsupported("added token", a);
      if (t.normalized && impl->nfc) {
        // Normalized tokens are looked for in normalized text, so compare normalized spellings.
        absl::StatusOr<std::string> n = internal::Nfc(t.content);
        if (!n.ok()) return n.status();
        t.content = *std::move(n);
      }
      impl->added.push_back(std::move(t));
    }
    for (const AddedToken& t : impl->added) {
      if (static_cast<size_t>(t.id) >= impl->id_bytes.size()) {
        impl->id_bytes.resize(t.id + 1);
        impl->id_kind.resize(t.id + 1, Impl::kNone);
      }
      impl->id_bytes[t.id] = t.content;
      impl->id_kind[t.id] = t.special ? Impl::kSpecial : Impl::kAdded;
    }
    std::vector<const AddedToken*> raw, normalized;
    for (const AddedToken& t : impl->added) (t.normalized ? normalized : raw).push_back(&t);
    impl->raw_splitter = std::make_unique<AddedTokenSplitter>(raw);
    impl->normalized_splitter = std::make_unique<AddedTokenSplitter>(normalized);

    if (!config_json.empty()) {
      const json config = json::parse(config_json);
      const json eos = config.value("eos_token", json());
      std::string eos_text;
      if (eos.is_string()) eos_text = eos.get<std::string>();
      if (eos.is_object()) eos_text = eos.value("content", "");
      for (const AddedToken& t : impl->added) {
        if (t.content == eos_text) impl->eos_id = t.id;
      }
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed tokenizer JSON: ", e.what()));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::Status Tokenizer::Impl::EncodeText(std::string_view text, std::vector<int32_t>* ids) const {
  std::string normalized_storage;
  if (nfc) {
    absl::StatusOr<std::string> n = internal::Nfc(text);
    if (!n.ok()) return n.status();
    normalized_storage = *std::move(n);
    text = normalized_storage;
  }
  std::vector<Segment> segments;
  if (normalized_splitter->empty()) {
    segments.push_back({text, -1});
  } else {
    normalized_splitter->Split(text, &segments);
  }
  std::vector<std::string_view> pieces, refined;
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      ids->push_back(seg.id);
      continue;
    }
    pieces.assign(1, seg.text);
    for (const auto& split : splits) {
      refined.clear();
      for (std::string_view p : pieces) {
        if (absl::Status s = split->Split(p, &refined); !s.ok()) return s;
      }
      pieces.swap(refined);
    }
    for (std::string_view p : pieces) bpe->EncodeWord(p, ids);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text is not valid UTF-8");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Segment> segments;
  impl_->raw_splitter->Split(text, &segments);
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else if (absl::Status s = impl_->EncodeText(seg.text, &ids); !s.ok()) {
      return s;
    }
  }
  return ids;
}

absl::StatusOr<std::string_view> Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size() ||
      impl_->id_kind[id] == Impl::kNone) {
    return absl::InvalidArgumentError(absl::StrCat("unknown token id ", id));
  }
  return std::string_view(impl_->id_bytes[id]);
}

absl::StatusOr<std::string> Tokenizer::DecodeText(std::span<const int32_t> ids) const {
  absl::StatusOr<std::string> bytes = Decode(ids);
  if (!bytes.ok()) return bytes.status();
  return ToValidUtf8(*bytes);
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    absl::StatusOr<std::string_view> bytes = TokenBytes(id);
    if (!bytes.ok()) return bytes.status();
    if (skip_special && impl_->id_kind[id] == Impl::kSpecial) continue;
    out.append(*bytes);
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_bytes.size()); }

int32_t Tokenizer::AddedTokenId(std::string_view content) const {
  for (const AddedToken& t : impl_->added) {
    if (t.content == content) return t.id;
  }
  return -1;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_kind.size() &&
         impl_->id_kind[id] == Impl::kSpecial;
}

int32_t Tokenizer::eos_id() const { return impl_->eos_id; }

}  // namespace cascade::tokenizer
