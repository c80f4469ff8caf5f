#include "fp4moe/safetensors.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "fp4moe/error.hpp"
#include "io/io_test_util.hpp"

namespace fp4moe {
namespace {

using test_util::raw_safetensors;
using test_util::TempDir;
using ::testing::HasSubstr;

// The message of the Error that parsing `file` throws ("" if it parses).
std::string parse_error(const std::vector<std::uint8_t>& file) {
  try {
    parse_safetensors(file, "t.safetensors");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kBadFile) << e.what();
    return e.what();
  }
  return "";
}

std::vector<std::uint8_t> iota_bytes(std::size_t n) {
  std::vector<std::uint8_t> v(n);
  std::iota(v.begin(), v.end(), std::uint8_t{1});
  return v;
}

TEST(SafetensorsDtype, NamesAndSizes) {
  EXPECT_EQ(dtype_name(Dtype::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(parse_dtype("BF16"), Dtype::kBF16);
  EXPECT_EQ(parse_dtype("bf16"), std::nullopt);
  EXPECT_EQ(dtype_bits(Dtype::kF4), 4);
  EXPECT_EQ(dtype_bits(Dtype::kF6E2M3), 6);
  EXPECT_EQ(dtype_bits(Dtype::kBool), 8);
  EXPECT_EQ(dtype_bits(Dtype::kBF16), 16);
  EXPECT_EQ(dtype_bits(Dtype::kF64), 64);
}

TEST(SafetensorsParse, ValidFileGivesTensorsInFileOrder) {
  // "b" first in the JSON but second in the data: the header is sorted by offset.
  const auto file = raw_safetensors(
      R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]},"a":{"dtype":"U8","shape":[2],)"
      R"("data_offsets":[0,2]},"__metadata__":{"format":"pt"}})",
      iota_bytes(6));
  const auto h = parse_safetensors(file, "t");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].dtype, Dtype::kBF16);
  EXPECT_EQ(h.tensors[1].shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(h.tensors[1].begin, 2u);
  EXPECT_EQ(h.tensors[1].bytes(), 4u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_offset, 8 + file.size() - 8 - 6);
}

TEST(SafetensorsParse, ZeroRankZeroSizeAndPackedDtypes) {
  const auto file = raw_safetensors(
      R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"z":{"dtype":"F32","shape":[0,5],)"
      R"("data_offsets":[4,4]},"f":{"dtype":"F4","shape":[3,2],"data_offsets":[4,7]}})",
      iota_bytes(7));
  const auto h = parse_safetensors(file, "t");
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].numel(), 1);
  EXPECT_EQ(h.tensors[0].shape_string(), "[]");
  EXPECT_EQ(h.tensors[1].name, "z");
  EXPECT_EQ(h.tensors[1].numel(), 0);
  EXPECT_EQ(h.tensors[2].bytes(), 3u);
}

TEST(SafetensorsParse, EmptyHeaderObjectIsAFileWithNoTensors) {
  EXPECT_EQ(parse_error(raw_safetensors("{}  ")), "");
}

TEST(SafetensorsParse, RejectsShortFileAndBadHeaderLength) {
  EXPECT_THAT(parse_error({1, 2, 3}), HasSubstr("t.safetensors: file is 3 bytes, too short"));
  EXPECT_THAT(parse_error(raw_safetensors("{}", {}, 100'000'001)),
              HasSubstr("header length 100000001 exceeds the limit of 100000000 bytes"));
  EXPECT_THAT(parse_error(raw_safetensors("{}", {}, 3)),
              HasSubstr("header length 3 runs past the end of the file (10 bytes, so at most 2)"));
}

TEST(SafetensorsParse, RejectsBadUtf8) {
  EXPECT_THAT(parse_error(raw_safetensors("{\"\xff\":1}")),
              HasSubstr("header is not valid UTF-8 (byte 0xff at header offset 2)"));
  // An overlong encoding of '/' and a UTF-16 surrogate are not UTF-8 either.
  EXPECT_THAT(parse_error(raw_safetensors("{\"\xc0\xaf\":1}")), HasSubstr("not valid UTF-8"));
  EXPECT_THAT(parse_error(raw_safetensors("{\"\xed\xa0\x80\":1}")), HasSubstr("not valid UTF-8"));
  // A multi-byte sequence cut by the end of the header.
  EXPECT_THAT(parse_error(raw_safetensors("{}\xe2\x82")), HasSubstr("at header offset 2"));
}

TEST(SafetensorsParse, RejectsBadJson) {
  EXPECT_THAT(parse_error(raw_safetensors("{\"a\":")), HasSubstr("header is not valid JSON"));
  EXPECT_THAT(parse_error(raw_safetensors("[1, 2]  ")),
              HasSubstr("header is a JSON array, expected an object"));
  EXPECT_THAT(parse_error(raw_safetensors(std::string(20, '[') + std::string(20, ']'))),
              HasSubstr("nests deeper than 16 levels"));
  EXPECT_THAT(parse_error(raw_safetensors(
                  R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],)"
                  R"("data_offsets":[1,2]}})",
                  iota_bytes(2))),
              HasSubstr("tensor 'a' is named twice"));
}

TEST(SafetensorsParse, RejectsBadMetadata) {
  EXPECT_THAT(parse_error(raw_safetensors(R"({"__metadata__":[1]})")),
              HasSubstr("__metadata__ is a JSON array, expected an object of strings"));
  EXPECT_THAT(parse_error(raw_safetensors(R"({"__metadata__":{"k":1}})")),
              HasSubstr("__metadata__ 'k' is a JSON number, expected a string"));
}

TEST(SafetensorsParse, RejectsBadTensorEntries) {
  const auto entry = [](std::string_view body) {
    return parse_error(raw_safetensors(fmt::format(R"({{"w":{}}})", body), iota_bytes(4)));
  };
  EXPECT_THAT(entry("5"), HasSubstr("tensor 'w': entry is a JSON number, expected an object"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":[4]})"), HasSubstr("tensor 'w': missing field 'data_offsets'"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1})"),
              HasSubstr("tensor 'w': unknown field 'x'"));
  EXPECT_THAT(entry(R"({"dtype":"Q4","shape":[4],"data_offsets":[0,4]})"),
              HasSubstr("tensor 'w': unknown dtype 'Q4' (known: BOOL, F4,"));
  EXPECT_THAT(entry(R"({"dtype":7,"shape":[4],"data_offsets":[0,4]})"), HasSubstr("dtype is not a string"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":4,"data_offsets":[0,4]})"), HasSubstr("shape is not an array"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":[-4],"data_offsets":[0,4]})"),
              HasSubstr("shape[0] = -4 is not a non-negative 64-bit integer"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":[4.0],"data_offsets":[0,4]})"),
              HasSubstr("shape[0] = 4.0 is not a non-negative"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,4]})"),
              HasSubstr("shape[0] = 9223372036854775808 is not a non-negative 64-bit integer"));
  EXPECT_THAT(entry(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})"),
              HasSubstr("tensor 'w': shape [4294967296, 4294967296] x 32 bits overflows 64 bits"));
  EXPECT_THAT(entry(R"({"dtype":"F4","shape":[3],"data_offsets":[0,4]})"),
              HasSubstr("F4 has 3 elements of 4 bits, not a whole number of bytes"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":[4],"data_offsets":[0]})"),
              HasSubstr("data_offsets is [0], expected [begin, end]"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":[4],"data_offsets":[-1,3]})"),
              HasSubstr("data_offsets [-1,3] are not non-negative 64-bit integers"));
  EXPECT_THAT(entry(R"({"dtype":"U8","shape":[0],"data_offsets":[4,0]})"),
              HasSubstr("data_offsets [4, 0] end before they begin"));
  EXPECT_THAT(entry(R"({"dtype":"BF16","shape":[4],"data_offsets":[0,4]})"),
              HasSubstr("tensor 'w': BF16 [4] is 8 bytes but data_offsets [0, 4] span 4 bytes"));
  EXPECT_THAT(parse_error(raw_safetensors(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})")),
              HasSubstr("a tensor has an empty name"));
}

TEST(SafetensorsParse, RejectsOverlapsGapsAndWrongFileLength) {
  EXPECT_THAT(parse_error(raw_safetensors(
                  R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"U8","shape":[2],)"
                  R"("data_offsets":[2,4]}})",
                  iota_bytes(4))),
              HasSubstr("tensors 'a' [0, 3) and 'b' [2, 4) overlap"));
  EXPECT_THAT(parse_error(raw_safetensors(
                  R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[1],)"
                  R"("data_offsets":[3,4]}})",
                  iota_bytes(4))),
              HasSubstr("gap of 1 bytes between 'a' (ends at 2) and 'b' (begins at 3)"));
  EXPECT_THAT(
      parse_error(raw_safetensors(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", iota_bytes(4))),
      HasSubstr("gap of 2 bytes before the first tensor 'a'"));
  const std::string one = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  EXPECT_THAT(
      parse_error(raw_safetensors(one, iota_bytes(3))),
      HasSubstr(fmt::format("file is {} bytes but the header says 8 + {} + 2 = {} (tensor data 2 bytes, 3 "
                            "in the file)",
                            8 + one.size() + 3, one.size(), 8 + one.size() + 2)));
  EXPECT_THAT(parse_error(raw_safetensors(one, iota_bytes(1))),
              HasSubstr("(tensor data 2 bytes, 1 in the file)"));
  // Offsets near 2^64 must not wrap around when compared with the file size.
  EXPECT_THAT(
      parse_error(raw_safetensors(
          R"({"a":{"dtype":"U8","shape":[5],"data_offsets":[18446744073709551610,18446744073709551615]}})")),
      HasSubstr("gap of 18446744073709551610 bytes before the first tensor 'a'"));
  EXPECT_THAT(
      parse_error(raw_safetensors(
          R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[18446744073709551614,18446744073709551616]}})")),
      HasSubstr("are not non-negative 64-bit integers"));
}

TEST(SafetensorsFile, WriterOutputFollowsTheSpecByteForByte) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("x", Dtype::kU8, {3}, std::vector<std::uint8_t>{7, 8, 9});
  w.add("s", Dtype::kF32, {}, std::vector<std::uint8_t>{0, 0, 0x80, 0x3f});
  w.set_metadata("format", "pt");
  w.write(dir / "a.safetensors");
  // F32 (4-byte elements) before U8; header padded with spaces to 96 = 8 * 12 bytes.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"s":{"data_offsets":[0,4],"dtype":"F32","shape":[]},)"
      R"("x":{"data_offsets":[4,7],"dtype":"U8","shape":[3]}})";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  const auto expected = raw_safetensors(padded, {0, 0, 0x80, 0x3f, 7, 8, 9});
  EXPECT_EQ(test_util::read_bytes(dir / "a.safetensors"), expected);
  EXPECT_EQ(padded.size() % 8, 0u);
}

TEST(SafetensorsFile, RoundTripThroughTheMapping) {
  TempDir dir;
  SafetensorsWriter w;
  const auto big = iota_bytes(1000);
  w.add_view("big", Dtype::kBF16, {10, 50}, big);
  w.add("half", Dtype::kF4, {2, 3}, std::vector<std::uint8_t>{0x21, 0x43, 0x65});
  int produced = 0;
  w.add_produced("made", Dtype::kI32, {2}, [&](std::span<std::uint8_t> out) {
    ++produced;
    ASSERT_EQ(out.size(), 8u);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint8_t>(100 + i);
  });
  std::vector<std::string> seen;
  w.write(dir / "r.safetensors", [&](std::string_view name, std::uint64_t) { seen.emplace_back(name); });
  EXPECT_EQ(produced, 1);
  EXPECT_EQ(seen, (std::vector<std::string>{"made", "big", "half"}));

  const auto f = SafetensorsFile::open(dir / "r.safetensors");
  EXPECT_EQ(f.tensors().size(), 3u);
  const auto& t = f.tensor("big");
  EXPECT_EQ(t.dtype, Dtype::kBF16);
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{10, 50}));
  const auto d = f.data(t);
  EXPECT_TRUE(std::equal(d.begin(), d.end(), big.begin(), big.end()));
  EXPECT_EQ(f.data(f.tensor("made"))[7], 107);
  EXPECT_EQ(f.data(f.tensor("half"))[2], 0x65);
  EXPECT_EQ(f.find("nope"), nullptr);
  try {
    f.tensor("nope");
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("r.safetensors: no tensor named 'nope'"));
  }
  // Every tensor starts on a multiple of its element size (the header is padded to 8).
  for (const auto& ti : f.tensors()) {
    EXPECT_EQ(
        (f.data(ti).data() - f.data(f.tensors().front()).data()) % std::max(1, dtype_bits(ti.dtype) / 8), 0)
        << ti.name;
  }
}

TEST(SafetensorsFile, WriterRejectsBadInputAndLeavesNoFileOnFailure) {
  TempDir dir;
  SafetensorsWriter w;
  EXPECT_THAT([&] { w.add("a", Dtype::kBF16, {3}, std::vector<std::uint8_t>(5)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("tensor 'a' needs 6 bytes, got 5")));
  EXPECT_EQ(w.size(), 0u);
  w.add("a", Dtype::kU8, {1}, std::vector<std::uint8_t>{1});
  EXPECT_THAT([&] { w.add("a", Dtype::kU8, {1}, std::vector<std::uint8_t>{1}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("tensor 'a' added twice")));
  EXPECT_THAT(
      [&] {
        w.add("f", Dtype::kF4, {3}, std::vector<std::uint8_t>{1, 2});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("3 elements of F4 is not a whole number of bytes")));
  w.add_produced("boom", Dtype::kU8, {4},
                 [](std::span<std::uint8_t>) { throw Error(Errc::kIo, "producer failed"); });
  EXPECT_THAT([&] { w.write(dir / "x.safetensors"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("producer failed")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a temporary or partial file was left behind";
}

TEST(SafetensorsFile, OpenRejectsMissingAndNonRegularFiles) {
  TempDir dir;
  EXPECT_THAT([&] { SafetensorsFile::open(dir / "none.safetensors"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("none.safetensors: cannot open: No such file")));
  EXPECT_THAT([&] { SafetensorsFile::open(dir.path()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("not a regular file")));
  test_util::write_bytes(dir / "empty.safetensors", {});
  EXPECT_THAT([&] { SafetensorsFile::open(dir / "empty.safetensors"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("empty.safetensors: file is 0 bytes, too short")));
  test_util::write_bytes(dir / "bad.safetensors", raw_safetensors("{\"a\":1}"));
  EXPECT_THAT(
      [&] { SafetensorsFile::open(dir / "bad.safetensors"); },
      ::testing::ThrowsMessage<Error>(HasSubstr("bad.safetensors: tensor 'a': entry is a JSON number")));
}

// Two shards and an index, as save_pretrained writes them.
void write_sharded(const TempDir& dir, std::string_view index) {
  SafetensorsWriter a;
  a.add("w1", Dtype::kU8, {2}, std::vector<std::uint8_t>{1, 2});
  a.write(dir / "model-00001-of-00002.safetensors");
  SafetensorsWriter b;
  b.add("w2", Dtype::kU8, {1}, std::vector<std::uint8_t>{3});
  b.add("w3", Dtype::kU8, {1}, std::vector<std::uint8_t>{4});
  b.write(dir / "model-00002-of-00002.safetensors");
  test_util::write_text(dir / "model.safetensors.index.json", index);
}

constexpr std::string_view kGoodIndex = R"({"metadata":{"total_size":4},"weight_map":{
  "w1":"model-00001-of-00002.safetensors","w2":"model-00002-of-00002.safetensors",
  "w3":"model-00002-of-00002.safetensors"}})";

TEST(ShardedSafetensors, OpensAnIndexedModel) {
  TempDir dir;
  write_sharded(dir, kGoodIndex);
  for (const auto& p : {dir.path(), dir / "model.safetensors.index.json"}) {
    const auto m = ShardedSafetensors::open(p);
    EXPECT_EQ(m.files().size(), 2u);
    EXPECT_EQ(m.names(), (std::vector<std::string>{"w1", "w2", "w3"}));
    EXPECT_EQ(m.data("w3")[0], 4);
    EXPECT_EQ(m.file_of("w1").path().filename(), "model-00001-of-00002.safetensors");
    EXPECT_TRUE(m.index_path().has_value());
    EXPECT_THAT([&] { m.tensor("w9"); }, ::testing::ThrowsMessage<Error>(HasSubstr("no tensor named 'w9'")));
  }
}

TEST(ShardedSafetensors, RejectsAnIndexThatDisagreesWithItsShards) {
  const auto open_error = [](std::string_view index) {
    TempDir dir;
    write_sharded(dir, index);
    try {
      ShardedSafetensors::open(dir.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(open_error(R"({"weight_map":{"w1":"model-00001-of-00002.safetensors",
      "w2":"model-00001-of-00002.safetensors","w3":"model-00002-of-00002.safetensors"}})"),
              HasSubstr("lists tensor 'w2' in model-00001-of-00002.safetensors, which does not hold it"));
  EXPECT_THAT(open_error(R"({"weight_map":{"w1":"model-00001-of-00002.safetensors",
      "w2":"model-00002-of-00002.safetensors"}})"),
              HasSubstr("model-00002-of-00002.safetensors: holds tensor 'w3', which"));
  EXPECT_THAT(open_error(R"({"weight_map":{"w1":"../model-00001-of-00002.safetensors"}})"),
              HasSubstr("is not a plain file name in the index's directory"));
  EXPECT_THAT(open_error(R"({"weight_map":{"w1":3}})"), HasSubstr("weight_map['w1'] is a JSON number"));
  EXPECT_THAT(open_error(R"({"weight_map":{}})"), HasSubstr("weight_map is empty"));
  EXPECT_THAT(open_error(R"({"metadata":{}})"),
              HasSubstr("expected a JSON object with a \"weight_map\" object"));
  EXPECT_THAT(open_error(R"({"weight_map":)"), HasSubstr("not valid JSON"));
  EXPECT_THAT(open_error(R"({"weight_map":{"w1":"missing.safetensors"}})"),
              HasSubstr("missing.safetensors: cannot open"));
}

TEST(ShardedSafetensors, DirectoryWithoutIndexNeedsExactlyOneFile) {
  TempDir dir;
  EXPECT_THAT(
      [&] { ShardedSafetensors::open(dir.path()); },
      ::testing::ThrowsMessage<Error>(HasSubstr("no .safetensors file and no model.safetensors.index.json")));
  SafetensorsWriter w;
  w.add("t", Dtype::kU8, {1}, std::vector<std::uint8_t>{5});
  w.write(dir / "one.safetensors");
  EXPECT_EQ(ShardedSafetensors::open(dir.path()).data("t")[0], 5);
  EXPECT_FALSE(ShardedSafetensors::open(dir.path()).index_path().has_value());
  w.write(dir / "two.safetensors");
  EXPECT_THAT(
      [&] { ShardedSafetensors::open(dir.path()); },
      ::testing::ThrowsMessage<Error>(HasSubstr("2 .safetensors files and no model.safetensors.index.json "
                                                "to say which tensors they hold: one.safetensors, "
                                                "two.safetensors")));
}

}  // namespace
}  // namespace fp4moe
