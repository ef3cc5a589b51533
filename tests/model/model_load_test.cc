// Safetensors and model loading: valid single-file and sharded models load the same tensors,
// and each kind of broken model directory is rejected with a message naming file and tensor.
// Also the generator's determinism, tokenizer copy and the mkmodel entry point.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gpu_worker/model/generator.h"
#include "gpu_worker/model/model.h"
#include "gtest/gtest.h"
#include "tests/common/scratch_dir.h"

namespace cascade::model {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A model directory of its own for each test, removed after it.
struct TempDir : test_support::ScratchDir {
  TempDir() : ScratchDir("cascade_model") {}
};

// Small enough that every test writes its own model in milliseconds.
ModelConfig SmallConfig() {
  ModelConfig c = PresetConfig("tiny");
  c.vocab_size = 64;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  return c;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Writes a safetensors file with a raw header and `data_bytes` zero bytes of data.
void WriteRawSafetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);  // little-endian host
  out += header;
  out.append(data_bytes, '\0');
  WriteAll(path, out);
}

class ModelLoadTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(WriteRandomModel(dir_, SmallConfig(), 7, "").ok()); }
  absl::Status Load() { return LoadModel(dir_).status(); }
  TempDir scratch_;
  const std::string dir_ = scratch_.path();
};

TEST_F(ModelLoadTest, LoadsEveryExpectedTensorWithItsShape) {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir_ + "/");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->name(), fs::path(dir_).filename().string());
  for (const ExpectedTensor& e : ExpectedTensors(SmallConfig())) {
    const TensorView* t = (*m)->Find(e.name);
    ASSERT_NE(t, nullptr) << e.name;
    EXPECT_EQ(t->shape, e.shape);
    EXPECT_EQ(t->dtype, DType::kBF16);
    EXPECT_EQ(t->file, dir_ + "/model.safetensors");
  }
  EXPECT_EQ((*m)->Find("lm_head.weight"), nullptr);  // tied
  EXPECT_THAT((*m)->config().eos_token_ids, testing::ElementsAre(151645, 151643));
}

TEST_F(ModelLoadTest, GeneratedWeightsAreSaneAndNormsNearOne) {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir_);
  ASSERT_TRUE(m.ok());
  const TensorView* norm = (*m)->Find("model.norm.weight");
  std::vector<float> v(norm->numel());
  ToFloat32(*norm, v.data());
  for (float x : v) EXPECT_NEAR(x, 1.0f, 0.11f);
  const TensorView* q = (*m)->Find("model.layers.0.self_attn.q_proj.weight");
  std::vector<float> w(q->numel());
  ToFloat32(*q, w.data());
  double sum_sq = 0;
  for (float x : w) sum_sq += x * x;
  // Expected variance 1/fan_in = 1/16.
  EXPECT_NEAR(sum_sq / w.size(), 1.0 / 16, 0.02);
}

TEST_F(ModelLoadTest, ShardedLoadEqualsSingleFileLoad) {
  TempDir sharded_dir;
  const std::string& sharded = sharded_dir.path();
  ASSERT_TRUE(WriteRandomModel(sharded, SmallConfig(), 7, "", 3).ok());
  EXPECT_FALSE(fs::exists(sharded + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(sharded + "/model-00003-of-00003.safetensors"));
  absl::StatusOr<std::unique_ptr<Model>> a = LoadModel(dir_), b = LoadModel(sharded);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  std::set<std::string> files;
  for (const ExpectedTensor& e : ExpectedTensors(SmallConfig())) {
    const TensorView *ta = (*a)->Find(e.name), *tb = (*b)->Find(e.name);
    ASSERT_EQ(ta->nbytes, tb->nbytes);
    EXPECT_EQ(std::memcmp(ta->data, tb->data, ta->nbytes), 0) << e.name;
    files.insert(tb->file);
  }
  EXPECT_EQ(files.size(), 3u);
}

TEST_F(ModelLoadTest, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir again, other;
  ASSERT_TRUE(WriteRandomModel(again.path(), SmallConfig(), 7, "").ok());
  ASSERT_TRUE(WriteRandomModel(other.path(), SmallConfig(), 8, "").ok());
  std::string base = ReadAll(dir_ + "/model.safetensors");
  EXPECT_EQ(base, ReadAll(again.path() + "/model.safetensors"));
  EXPECT_NE(base, ReadAll(other.path() + "/model.safetensors"));
}

TEST_F(ModelLoadTest, MissingConfigIsNotFound) {
  fs::remove(dir_ + "/config.json");
  EXPECT_EQ(Load().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Load().message(), HasSubstr("config.json"));
}

TEST_F(ModelLoadTest, BadConfigJsonIsInvalidArgumentNamingTheFile) {
  WriteAll(dir_ + "/config.json", "{\"model_type\": ");
  EXPECT_EQ(Load().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Load().message(), AllOf(HasSubstr("config.json"), HasSubstr("JSON")));
}

TEST_F(ModelLoadTest, MissingWeightsIsNotFound) {
  fs::remove(dir_ + "/model.safetensors");
  EXPECT_EQ(Load().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Load().message(), HasSubstr("model.safetensors"));
}

// Rewrites the weights with one tensor dropped or reshaped.
void RewriteWeights(const std::string& dir, const std::string& drop, const std::string& reshape) {
  std::vector<TensorSpec> specs;
  for (const ExpectedTensor& e : ExpectedTensors(SmallConfig())) {
    if (e.name == drop) continue;
    TensorSpec s{e.name, DType::kF32, e.shape};
    if (e.name == reshape) s.shape[0] += 1;
    specs.push_back(s);
  }
  ASSERT_TRUE(
      WriteSafetensors(dir + "/model.safetensors", specs, [&](size_t i, std::vector<uint8_t>* b) {
        b->assign(specs[i].numel() * 4, 0);
      }).ok());
}

TEST_F(ModelLoadTest, MissingTensorIsNotFoundNamingFileAndTensor) {
  RewriteWeights(dir_, "model.layers.1.mlp.up_proj.weight", "");
  EXPECT_EQ(Load().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Load().message(), AllOf(HasSubstr("model.safetensors"),
                                      HasSubstr("model.layers.1.mlp.up_proj.weight")));
}

TEST_F(ModelLoadTest, WrongShapeIsInvalidArgumentNamingFileTensorAndShapes) {
  RewriteWeights(dir_, "", "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(Load().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Load().message(), AllOf(HasSubstr("model.safetensors"),
                                      HasSubstr("model.layers.0.self_attn.k_proj.weight"),
                                      HasSubstr("[9, 16]"), HasSubstr("expected [8, 16]")));
}

TEST_F(ModelLoadTest, TruncatedFileIsInvalidArgumentNamingTheTensorCut) {
  std::string path = dir_ + "/model.safetensors";
  std::string bytes = ReadAll(path);
  WriteAll(path, bytes.substr(0, bytes.size() - 10));
  EXPECT_EQ(Load().code(), absl::StatusCode::kInvalidArgument);
  // The generator writes tensors in ExpectedTensors() order; the last one is cut.
  EXPECT_THAT(Load().message(),
              AllOf(HasSubstr(path), HasSubstr("model.norm.weight"), HasSubstr("out of bounds")));
  WriteAll(path, bytes.substr(0, 5));
  EXPECT_THAT(Load().message(), AllOf(HasSubstr(path), HasSubstr("truncated")));
}

TEST_F(ModelLoadTest, BadHeadersAreInvalidArgument) {
  std::string path = dir_ + "/model.safetensors";
  struct Case {
    std::string header;
    size_t data_bytes;
    std::string want;
  };
  for (const Case& c : std::vector<Case>{
           {"{not json", 0, "not a valid JSON"},
           {R"({"a": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}})", 2, "'a': dtype I8"},
           {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8, "need 8"},
           {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            8, "'b': data overlaps tensor 'a'"},
           {R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8, "negative"},
           {R"({"a": {"dtype": "F32", "shape": [2]}})", 8, "'a': data_offsets"},
           // Found by tests/fuzz/model_loader_fuzz: a shape whose element count overflows
           // int64, and one whose byte count wraps size_t to 0 (it was accepted, and reading
           // numel() elements ran off the mapping).
           {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
            0, "'a': shape and dtype need more bytes"},
           {R"({"a": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0,
            "'a': shape and dtype need more bytes"},
           {R"({"a": {"dtype": "F32", "shape": [0, 4611686018427387904], "data_offsets": [0, 0]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})",
            8, "'b': data_offsets span 4 bytes but shape and dtype need 8"},
       }) {
    WriteRawSafetensors(path, c.header, c.data_bytes);
    absl::Status s = Load();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.header;
    EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr(c.want))) << c.header;
  }
  // A name or dtype from the file is clipped in the message.
  const std::string long_name(5000, 'n');
  WriteRawSafetensors(
      path, R"({")" + long_name + R"(": {"dtype": "I8", "shape": [1], "data_offsets": [0, 1]}})",
      1);
  EXPECT_THAT(Load().message(), HasSubstr("nnnn...': dtype I8"));
  EXPECT_LT(Load().message().size(), 400u);
  // Header length larger than the file.
  std::string huge(8, '\0');
  huge[3] = 1;
  WriteAll(path, huge + "{}");
  EXPECT_THAT(Load().message(), HasSubstr("header length"));
}

TEST_F(ModelLoadTest, MissingShardIsNotFoundNamingTheShard) {
  TempDir sharded_dir;
  const std::string& sharded = sharded_dir.path();
  ASSERT_TRUE(WriteRandomModel(sharded, SmallConfig(), 7, "", 3).ok());
  fs::remove(sharded + "/model-00002-of-00003.safetensors");
  absl::Status s = LoadModel(sharded).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("model-00002-of-00003.safetensors"),
                                 HasSubstr("model.safetensors.index.json")));
}

TEST(SafetensorsTest, HalfAndBfloatConvertExactly) {
  const uint16_t f16[] = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x7bff, 0x7c00, 0x8000};
  const float want16[] = {
      1.0f, -2.0f, 0x1p-24f, 1023 * 0x1p-24f, 65504.0f, std::numeric_limits<float>::infinity(),
      -0.0f};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(F16ToFloat(f16[i]), want16[i]) << i;
  EXPECT_TRUE(std::signbit(F16ToFloat(0x8000)));
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7e00)));
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);  // tie rounds to even
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  // ToFloat32 on an unaligned view.
  alignas(4) uint8_t raw[5] = {0, 0x00, 0x3c, 0x00, 0xc0};
  TensorView t{"x", DType::kF16, {2}, raw + 1, 4, "mem"};
  float out[2];
  ToFloat32(t, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
}

TEST(GeneratorTest, TinyPresetCopiesTheQwen3TokenizerAndLoads) {
  std::string tok = DefaultTokenizerDir();
  if (!fs::exists(tok + "/tokenizer.json")) GTEST_SKIP() << tok << " missing: run scripts/setup.sh";
  TempDir scratch;
  const std::string dir = scratch.path() + "/tiny";
  ASSERT_TRUE(RunMkmodel({"--preset", "tiny", "--out", dir, "--seed=3"}).ok());
  EXPECT_TRUE(fs::exists(dir + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(dir + "/tokenizer_config.json"));
  EXPECT_TRUE(fs::exists(dir + "/generation_config.json"));
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->name(), "tiny");
  EXPECT_EQ((*m)->config().vocab_size, 151936);
}

TEST(GeneratorTest, MkmodelRejectsBadFlagsAndWritesNothing) {
  TempDir scratch;
  const std::string out = scratch.path() + "/x";
  EXPECT_EQ(RunMkmodel(std::vector<std::string>{"--preset", "tiny"}).code(),
            absl::StatusCode::kInvalidArgument);  // no --out
  EXPECT_EQ(RunMkmodel(std::vector<std::string>{"--bogus", "1"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunMkmodel(std::vector<std::string>{"--preset", "nope", "--out", out}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunMkmodel(std::vector<std::string>{"--seed", "abc", "--out", out}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace cascade::model
