#include "data/tokenizer_bpe.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.hpp"
#include "util/regular_file.hpp"

namespace fs = std::filesystem;

namespace tessera::data {

namespace {

constexpr uint32_t kInvalid = 0xFFFFFFFFu;  // a byte that is not valid UTF-8

enum RangeClass : uint8_t { kL, kN };
struct Range {
  uint32_t first, last;
  RangeClass cls;
};

// Letters (general category L*) and numbers (N*) above U+007F, Unicode 14,
// unassigned code points between two code points of the same class merged
// into their range. Generated with Python's unicodedata: for each assigned
// code point from U+0080 classify L, N or other, and join runs of a class.
// clang-format off
constexpr Range kRanges[] = {
    {0xAA, 0xAA, kL}, {0xB2, 0xB3, kN}, {0xB5, 0xB5, kL}, {0xB9, 0xB9, kN}, {0xBA, 0xBA, kL},
    {0xBC, 0xBE, kN}, {0xC0, 0xD6, kL}, {0xD8, 0xF6, kL}, {0xF8, 0x2C1, kL}, {0x2C6, 0x2D1, kL},
    {0x2E0, 0x2E4, kL}, {0x2EC, 0x2EC, kL}, {0x2EE, 0x2EE, kL}, {0x370, 0x374, kL},
    {0x376, 0x37D, kL}, {0x37F, 0x37F, kL}, {0x386, 0x386, kL}, {0x388, 0x3F5, kL},
    {0x3F7, 0x481, kL}, {0x48A, 0x559, kL}, {0x560, 0x588, kL}, {0x5D0, 0x5F2, kL},
    {0x620, 0x64A, kL}, {0x660, 0x669, kN}, {0x66E, 0x66F, kL}, {0x671, 0x6D3, kL},
    {0x6D5, 0x6D5, kL}, {0x6E5, 0x6E6, kL}, {0x6EE, 0x6EF, kL}, {0x6F0, 0x6F9, kN},
    {0x6FA, 0x6FC, kL}, {0x6FF, 0x6FF, kL}, {0x710, 0x710, kL}, {0x712, 0x72F, kL},
    {0x74D, 0x7A5, kL}, {0x7B1, 0x7B1, kL}, {0x7C0, 0x7C9, kN}, {0x7CA, 0x7EA, kL},
    {0x7F4, 0x7F5, kL}, {0x7FA, 0x7FA, kL}, {0x800, 0x815, kL}, {0x81A, 0x81A, kL},
    {0x824, 0x824, kL}, {0x828, 0x828, kL}, {0x840, 0x858, kL}, {0x860, 0x887, kL},
    {0x889, 0x88E, kL}, {0x8A0, 0x8C9, kL}, {0x904, 0x939, kL}, {0x93D, 0x93D, kL},
    {0x950, 0x950, kL}, {0x958, 0x961, kL}, {0x966, 0x96F, kN}, {0x971, 0x980, kL},
    {0x985, 0x9B9, kL}, {0x9BD, 0x9BD, kL}, {0x9CE, 0x9CE, kL}, {0x9DC, 0x9E1, kL},
    {0x9E6, 0x9EF, kN}, {0x9F0, 0x9F1, kL}, {0x9F4, 0x9F9, kN}, {0x9FC, 0x9FC, kL},
    {0xA05, 0xA39, kL}, {0xA59, 0xA5E, kL}, {0xA66, 0xA6F, kN}, {0xA72, 0xA74, kL},
    {0xA85, 0xAB9, kL}, {0xABD, 0xABD, kL}, {0xAD0, 0xAE1, kL}, {0xAE6, 0xAEF, kN},
    {0xAF9, 0xAF9, kL}, {0xB05, 0xB39, kL}, {0xB3D, 0xB3D, kL}, {0xB5C, 0xB61, kL},
    {0xB66, 0xB6F, kN}, {0xB71, 0xB71, kL}, {0xB72, 0xB77, kN}, {0xB83, 0xBB9, kL},
    {0xBD0, 0xBD0, kL}, {0xBE6, 0xBF2, kN}, {0xC05, 0xC39, kL}, {0xC3D, 0xC3D, kL},
    {0xC58, 0xC61, kL}, {0xC66, 0xC6F, kN}, {0xC78, 0xC7E, kN}, {0xC80, 0xC80, kL},
    {0xC85, 0xCB9, kL}, {0xCBD, 0xCBD, kL}, {0xCDD, 0xCE1, kL}, {0xCE6, 0xCEF, kN},
    {0xCF1, 0xCF2, kL}, {0xD04, 0xD3A, kL}, {0xD3D, 0xD3D, kL}, {0xD4E, 0xD4E, kL},
    {0xD54, 0xD56, kL}, {0xD58, 0xD5E, kN}, {0xD5F, 0xD61, kL}, {0xD66, 0xD78, kN},
    {0xD7A, 0xD7F, kL}, {0xD85, 0xDC6, kL}, {0xDE6, 0xDEF, kN}, {0xE01, 0xE30, kL},
    {0xE32, 0xE33, kL}, {0xE40, 0xE46, kL}, {0xE50, 0xE59, kN}, {0xE81, 0xEB0, kL},
    {0xEB2, 0xEB3, kL}, {0xEBD, 0xEC6, kL}, {0xED0, 0xED9, kN}, {0xEDC, 0xF00, kL},
    {0xF20, 0xF33, kN}, {0xF40, 0xF6C, kL}, {0xF88, 0xF8C, kL}, {0x1000, 0x102A, kL},
    {0x103F, 0x103F, kL}, {0x1040, 0x1049, kN}, {0x1050, 0x1055, kL}, {0x105A, 0x105D, kL},
    {0x1061, 0x1061, kL}, {0x1065, 0x1066, kL}, {0x106E, 0x1070, kL}, {0x1075, 0x1081, kL},
    {0x108E, 0x108E, kL}, {0x1090, 0x1099, kN}, {0x10A0, 0x10FA, kL}, {0x10FC, 0x135A, kL},
    {0x1369, 0x137C, kN}, {0x1380, 0x138F, kL}, {0x13A0, 0x13FD, kL}, {0x1401, 0x166C, kL},
    {0x166F, 0x167F, kL}, {0x1681, 0x169A, kL}, {0x16A0, 0x16EA, kL}, {0x16EE, 0x16F0, kN},
    {0x16F1, 0x1711, kL}, {0x171F, 0x1731, kL}, {0x1740, 0x1751, kL}, {0x1760, 0x1770, kL},
    {0x1780, 0x17B3, kL}, {0x17D7, 0x17D7, kL}, {0x17DC, 0x17DC, kL}, {0x17E0, 0x17F9, kN},
    {0x1810, 0x1819, kN}, {0x1820, 0x1884, kL}, {0x1887, 0x18A8, kL}, {0x18AA, 0x191E, kL},
    {0x1946, 0x194F, kN}, {0x1950, 0x19C9, kL}, {0x19D0, 0x19DA, kN}, {0x1A00, 0x1A16, kL},
    {0x1A20, 0x1A54, kL}, {0x1A80, 0x1A99, kN}, {0x1AA7, 0x1AA7, kL}, {0x1B05, 0x1B33, kL},
    {0x1B45, 0x1B4C, kL}, {0x1B50, 0x1B59, kN}, {0x1B83, 0x1BA0, kL}, {0x1BAE, 0x1BAF, kL},
    {0x1BB0, 0x1BB9, kN}, {0x1BBA, 0x1BE5, kL}, {0x1C00, 0x1C23, kL}, {0x1C40, 0x1C49, kN},
    {0x1C4D, 0x1C4F, kL}, {0x1C50, 0x1C59, kN}, {0x1C5A, 0x1C7D, kL}, {0x1C80, 0x1CBF, kL},
    {0x1CE9, 0x1CEC, kL}, {0x1CEE, 0x1CF3, kL}, {0x1CF5, 0x1CF6, kL}, {0x1CFA, 0x1DBF, kL},
    {0x1E00, 0x1FBC, kL}, {0x1FBE, 0x1FBE, kL}, {0x1FC2, 0x1FCC, kL}, {0x1FD0, 0x1FDB, kL},
    {0x1FE0, 0x1FEC, kL}, {0x1FF2, 0x1FFC, kL}, {0x2070, 0x2070, kN}, {0x2071, 0x2071, kL},
    {0x2074, 0x2079, kN}, {0x207F, 0x207F, kL}, {0x2080, 0x2089, kN}, {0x2090, 0x209C, kL},
    {0x2102, 0x2102, kL}, {0x2107, 0x2107, kL}, {0x210A, 0x2113, kL}, {0x2115, 0x2115, kL},
    {0x2119, 0x211D, kL}, {0x2124, 0x2124, kL}, {0x2126, 0x2126, kL}, {0x2128, 0x2128, kL},
    {0x212A, 0x212D, kL}, {0x212F, 0x2139, kL}, {0x213C, 0x213F, kL}, {0x2145, 0x2149, kL},
    {0x214E, 0x214E, kL}, {0x2150, 0x2182, kN}, {0x2183, 0x2184, kL}, {0x2185, 0x2189, kN},
    {0x2460, 0x249B, kN}, {0x24EA, 0x24FF, kN}, {0x2776, 0x2793, kN}, {0x2C00, 0x2CE4, kL},
    {0x2CEB, 0x2CEE, kL}, {0x2CF2, 0x2CF3, kL}, {0x2CFD, 0x2CFD, kN}, {0x2D00, 0x2D6F, kL},
    {0x2D80, 0x2DDE, kL}, {0x2E2F, 0x2E2F, kL}, {0x3005, 0x3006, kL}, {0x3007, 0x3007, kN},
    {0x3021, 0x3029, kN}, {0x3031, 0x3035, kL}, {0x3038, 0x303A, kN}, {0x303B, 0x303C, kL},
    {0x3041, 0x3096, kL}, {0x309D, 0x309F, kL}, {0x30A1, 0x30FA, kL}, {0x30FC, 0x318E, kL},
    {0x3192, 0x3195, kN}, {0x31A0, 0x31BF, kL}, {0x31F0, 0x31FF, kL}, {0x3220, 0x3229, kN},
    {0x3248, 0x324F, kN}, {0x3251, 0x325F, kN}, {0x3280, 0x3289, kN}, {0x32B1, 0x32BF, kN},
    {0x3400, 0x4DBF, kL}, {0x4E00, 0xA48C, kL}, {0xA4D0, 0xA4FD, kL}, {0xA500, 0xA60C, kL},
    {0xA610, 0xA61F, kL}, {0xA620, 0xA629, kN}, {0xA62A, 0xA66E, kL}, {0xA67F, 0xA69D, kL},
    {0xA6A0, 0xA6E5, kL}, {0xA6E6, 0xA6EF, kN}, {0xA717, 0xA71F, kL}, {0xA722, 0xA788, kL},
    {0xA78B, 0xA801, kL}, {0xA803, 0xA805, kL}, {0xA807, 0xA80A, kL}, {0xA80C, 0xA822, kL},
    {0xA830, 0xA835, kN}, {0xA840, 0xA873, kL}, {0xA882, 0xA8B3, kL}, {0xA8D0, 0xA8D9, kN},
    {0xA8F2, 0xA8F7, kL}, {0xA8FB, 0xA8FB, kL}, {0xA8FD, 0xA8FE, kL}, {0xA900, 0xA909, kN},
    {0xA90A, 0xA925, kL}, {0xA930, 0xA946, kL}, {0xA960, 0xA97C, kL}, {0xA984, 0xA9B2, kL},
    {0xA9CF, 0xA9CF, kL}, {0xA9D0, 0xA9D9, kN}, {0xA9E0, 0xA9E4, kL}, {0xA9E6, 0xA9EF, kL},
    {0xA9F0, 0xA9F9, kN}, {0xA9FA, 0xAA28, kL}, {0xAA40, 0xAA42, kL}, {0xAA44, 0xAA4B, kL},
    {0xAA50, 0xAA59, kN}, {0xAA60, 0xAA76, kL}, {0xAA7A, 0xAA7A, kL}, {0xAA7E, 0xAAAF, kL},
    {0xAAB1, 0xAAB1, kL}, {0xAAB5, 0xAAB6, kL}, {0xAAB9, 0xAABD, kL}, {0xAAC0, 0xAAC0, kL},
    {0xAAC2, 0xAADD, kL}, {0xAAE0, 0xAAEA, kL}, {0xAAF2, 0xAAF4, kL}, {0xAB01, 0xAB5A, kL},
    {0xAB5C, 0xAB69, kL}, {0xAB70, 0xABE2, kL}, {0xABF0, 0xABF9, kN}, {0xAC00, 0xD7FB, kL},
    {0xF900, 0xFB1D, kL}, {0xFB1F, 0xFB28, kL}, {0xFB2A, 0xFBB1, kL}, {0xFBD3, 0xFD3D, kL},
    {0xFD50, 0xFDC7, kL}, {0xFDF0, 0xFDFB, kL}, {0xFE70, 0xFEFC, kL}, {0xFF10, 0xFF19, kN},
    {0xFF21, 0xFF3A, kL}, {0xFF41, 0xFF5A, kL}, {0xFF66, 0xFFDC, kL}, {0x10000, 0x100FA, kL},
    {0x10107, 0x10133, kN}, {0x10140, 0x10178, kN}, {0x1018A, 0x1018B, kN},
    {0x10280, 0x102D0, kL}, {0x102E1, 0x102FB, kN}, {0x10300, 0x1031F, kL},
    {0x10320, 0x10323, kN}, {0x1032D, 0x10340, kL}, {0x10341, 0x10341, kN},
    {0x10342, 0x10349, kL}, {0x1034A, 0x1034A, kN}, {0x10350, 0x10375, kL},
    {0x10380, 0x1039D, kL}, {0x103A0, 0x103CF, kL}, {0x103D1, 0x103D5, kN},
    {0x10400, 0x1049D, kL}, {0x104A0, 0x104A9, kN}, {0x104B0, 0x10563, kL},
    {0x10570, 0x10855, kL}, {0x10858, 0x1085F, kN}, {0x10860, 0x10876, kL},
    {0x10879, 0x1087F, kN}, {0x10880, 0x1089E, kL}, {0x108A7, 0x108AF, kN},
    {0x108E0, 0x108F5, kL}, {0x108FB, 0x108FF, kN}, {0x10900, 0x10915, kL},
    {0x10916, 0x1091B, kN}, {0x10920, 0x10939, kL}, {0x10980, 0x109B7, kL},
    {0x109BC, 0x109BD, kN}, {0x109BE, 0x109BF, kL}, {0x109C0, 0x109FF, kN},
    {0x10A00, 0x10A00, kL}, {0x10A10, 0x10A35, kL}, {0x10A40, 0x10A48, kN},
    {0x10A60, 0x10A7C, kL}, {0x10A7D, 0x10A7E, kN}, {0x10A80, 0x10A9C, kL},
    {0x10A9D, 0x10A9F, kN}, {0x10AC0, 0x10AC7, kL}, {0x10AC9, 0x10AE4, kL},
    {0x10AEB, 0x10AEF, kN}, {0x10B00, 0x10B35, kL}, {0x10B40, 0x10B55, kL},
    {0x10B58, 0x10B5F, kN}, {0x10B60, 0x10B72, kL}, {0x10B78, 0x10B7F, kN},
    {0x10B80, 0x10B91, kL}, {0x10BA9, 0x10BAF, kN}, {0x10C00, 0x10CF2, kL},
    {0x10CFA, 0x10CFF, kN}, {0x10D00, 0x10D23, kL}, {0x10D30, 0x10E7E, kN},
    {0x10E80, 0x10EA9, kL}, {0x10EB0, 0x10F1C, kL}, {0x10F1D, 0x10F26, kN},
    {0x10F27, 0x10F45, kL}, {0x10F51, 0x10F54, kN}, {0x10F70, 0x10F81, kL},
    {0x10FB0, 0x10FC4, kL}, {0x10FC5, 0x10FCB, kN}, {0x10FE0, 0x10FF6, kL},
    {0x11003, 0x11037, kL}, {0x11052, 0x1106F, kN}, {0x11071, 0x11072, kL},
    {0x11075, 0x11075, kL}, {0x11083, 0x110AF, kL}, {0x110D0, 0x110E8, kL},
    {0x110F0, 0x110F9, kN}, {0x11103, 0x11126, kL}, {0x11136, 0x1113F, kN},
    {0x11144, 0x11144, kL}, {0x11147, 0x11172, kL}, {0x11176, 0x11176, kL},
    {0x11183, 0x111B2, kL}, {0x111C1, 0x111C4, kL}, {0x111D0, 0x111D9, kN},
    {0x111DA, 0x111DA, kL}, {0x111DC, 0x111DC, kL}, {0x111E1, 0x111F4, kN},
    {0x11200, 0x1122B, kL}, {0x11280, 0x112A8, kL}, {0x112B0, 0x112DE, kL},
    {0x112F0, 0x112F9, kN}, {0x11305, 0x11339, kL}, {0x1133D, 0x1133D, kL},
    {0x11350, 0x11350, kL}, {0x1135D, 0x11361, kL}, {0x11400, 0x11434, kL},
    {0x11447, 0x1144A, kL}, {0x11450, 0x11459, kN}, {0x1145F, 0x114AF, kL},
    {0x114C4, 0x114C5, kL}, {0x114C7, 0x114C7, kL}, {0x114D0, 0x114D9, kN},
    {0x11580, 0x115AE, kL}, {0x115D8, 0x115DB, kL}, {0x11600, 0x1162F, kL},
    {0x11644, 0x11644, kL}, {0x11650, 0x11659, kN}, {0x11680, 0x116AA, kL},
    {0x116B8, 0x116B8, kL}, {0x116C0, 0x116C9, kN}, {0x11700, 0x1171A, kL},
    {0x11730, 0x1173B, kN}, {0x11740, 0x1182B, kL}, {0x118A0, 0x118DF, kL},
    {0x118E0, 0x118F2, kN}, {0x118FF, 0x1192F, kL}, {0x1193F, 0x1193F, kL},
    {0x11941, 0x11941, kL}, {0x11950, 0x11959, kN}, {0x119A0, 0x119D0, kL},
    {0x119E1, 0x119E1, kL}, {0x119E3, 0x119E3, kL}, {0x11A00, 0x11A00, kL},
    {0x11A0B, 0x11A32, kL}, {0x11A3A, 0x11A3A, kL}, {0x11A50, 0x11A50, kL},
    {0x11A5C, 0x11A89, kL}, {0x11A9D, 0x11A9D, kL}, {0x11AB0, 0x11C2E, kL},
    {0x11C40, 0x11C40, kL}, {0x11C50, 0x11C6C, kN}, {0x11C72, 0x11C8F, kL},
    {0x11D00, 0x11D30, kL}, {0x11D46, 0x11D46, kL}, {0x11D50, 0x11D59, kN},
    {0x11D60, 0x11D89, kL}, {0x11D98, 0x11D98, kL}, {0x11DA0, 0x11DA9, kN},
    {0x11EE0, 0x11EF2, kL}, {0x11FB0, 0x11FB0, kL}, {0x11FC0, 0x11FD4, kN},
    {0x12000, 0x12399, kL}, {0x12400, 0x1246E, kN}, {0x12480, 0x12FF0, kL},
    {0x13000, 0x1342E, kL}, {0x14400, 0x16A5E, kL}, {0x16A60, 0x16A69, kN},
    {0x16A70, 0x16ABE, kL}, {0x16AC0, 0x16AC9, kN}, {0x16AD0, 0x16AED, kL},
    {0x16B00, 0x16B2F, kL}, {0x16B40, 0x16B43, kL}, {0x16B50, 0x16B61, kN},
    {0x16B63, 0x16E7F, kL}, {0x16E80, 0x16E96, kN}, {0x16F00, 0x16F4A, kL},
    {0x16F50, 0x16F50, kL}, {0x16F93, 0x16FE1, kL}, {0x16FE3, 0x16FE3, kL},
    {0x17000, 0x1BC99, kL}, {0x1D2E0, 0x1D2F3, kN}, {0x1D360, 0x1D378, kN},
    {0x1D400, 0x1D6C0, kL}, {0x1D6C2, 0x1D6DA, kL}, {0x1D6DC, 0x1D6FA, kL},
    {0x1D6FC, 0x1D714, kL}, {0x1D716, 0x1D734, kL}, {0x1D736, 0x1D74E, kL},
    {0x1D750, 0x1D76E, kL}, {0x1D770, 0x1D788, kL}, {0x1D78A, 0x1D7A8, kL},
    {0x1D7AA, 0x1D7C2, kL}, {0x1D7C4, 0x1D7CB, kL}, {0x1D7CE, 0x1D7FF, kN},
    {0x1DF00, 0x1DF1E, kL}, {0x1E100, 0x1E12C, kL}, {0x1E137, 0x1E13D, kL},
    {0x1E140, 0x1E149, kN}, {0x1E14E, 0x1E14E, kL}, {0x1E290, 0x1E2AD, kL},
    {0x1E2C0, 0x1E2EB, kL}, {0x1E2F0, 0x1E2F9, kN}, {0x1E7E0, 0x1E8C4, kL},
    {0x1E8C7, 0x1E8CF, kN}, {0x1E900, 0x1E943, kL}, {0x1E94B, 0x1E94B, kL},
    {0x1E950, 0x1E959, kN}, {0x1EC71, 0x1ECAB, kN}, {0x1ECAD, 0x1ECAF, kN},
    {0x1ECB1, 0x1ED2D, kN}, {0x1ED2F, 0x1ED3D, kN}, {0x1EE00, 0x1EEBB, kL},
    {0x1F100, 0x1F10C, kN}, {0x1FBF0, 0x1FBF9, kN}, {0x20000, 0x3134A, kL},
};
// clang-format on

bool is_white_space(uint32_t cp) {
  // Unicode's White_Space property.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

struct Char {
  uint32_t cp;  // kInvalid for a stray byte
  uint32_t start, len;
};

// Decodes UTF-8 leniently: a byte that does not start a valid sequence
// (overlong, surrogate, out of range, cut short) is one kInvalid char.
std::vector<Char> decode_utf8(std::string_view s) {
  std::vector<Char> out;
  out.reserve(s.size());
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    uint32_t cp = kInvalid, len = 1;
    if (b < 0x80) {
      cp = b;
    } else {
      uint32_t need = 0, min = 0, v = 0;
      if ((b & 0xE0) == 0xC0) {
        need = 1, min = 0x80, v = b & 0x1F;
      } else if ((b & 0xF0) == 0xE0) {
        need = 2, min = 0x800, v = b & 0x0F;
      } else if ((b & 0xF8) == 0xF0) {
        need = 3, min = 0x10000, v = b & 0x07;
      }
      bool ok = need > 0;
      for (uint32_t k = 1; ok && k <= need; ++k) {
        if (i + k >= n || (p[i + k] & 0xC0) != 0x80) {
          ok = false;
        } else {
          v = (v << 6) | (p[i + k] & 0x3F);
        }
      }
      if (ok && v >= min && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF)) {
        cp = v;
        len = need + 1;
      }
    }
    out.push_back(Char{cp, static_cast<uint32_t>(i), len});
    i += len;
  }
  return out;
}

CharClass class_of(const Char &c) {
  return c.cp == kInvalid ? CharClass::kOther : char_class(c.cp);
}

std::string read_file(const fs::path &path, const std::string &role) {
  return read_regular(path.string(), role);
}

}  // namespace

CharClass char_class(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    return is_white_space(cp) ? CharClass::kSpace : CharClass::kOther;
  }
  if (is_white_space(cp)) return CharClass::kSpace;
  const auto *end = std::end(kRanges);
  const auto *it = std::upper_bound(std::begin(kRanges), end, cp,
                                    [](uint32_t v, const Range &r) { return v < r.first; });
  if (it == std::begin(kRanges)) return CharClass::kOther;
  --it;
  if (cp > it->last) return CharClass::kOther;
  return it->cls == kL ? CharClass::kLetter : CharClass::kNumber;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  const std::vector<Char> c = decode_utf8(text);
  const size_t n = c.size();
  std::vector<std::string_view> out;
  auto emit = [&](size_t from, size_t to) {  // chars [from, to)
    const size_t a = c[from].start, b = c[to - 1].start + c[to - 1].len;
    out.push_back(text.substr(a, b - a));
  };
  size_t i = 0;
  while (i < n) {
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c[i].cp == '\'' && i + 1 < n) {
      const uint32_t a = c[i + 1].cp, b = i + 2 < n ? c[i + 2].cp : 0;
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        len = 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        len = 3;
      if (len) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
    bool matched = false;
    for (CharClass cls : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
      size_t from = i;
      if (c[i].cp == ' ' && i + 1 < n && class_of(c[i + 1]) == cls)
        from = i + 1;
      else if (class_of(c[i]) != cls)
        continue;
      size_t j = from;
      while (j < n && class_of(c[j]) == cls) ++j;
      emit(i, j);
      i = j;
      matched = true;
      break;
    }
    if (matched) continue;
    // \s+(?!\S) | \s+  (c[i] is white space here)
    size_t j = i;
    while (j < n && class_of(c[j]) == CharClass::kSpace) ++j;
    if (j < n && j - i >= 2) --j;  // leave the last space to the word after it
    emit(i, j);
    i = j;
  }
  return out;
}

Gpt2Bpe Gpt2Bpe::load(const fs::path &encoder_json, const fs::path &vocab_bpe) {
  const std::string encoder = read_file(encoder_json, "encoder file");
  const std::string merges = read_file(vocab_bpe, "BPE merges file");
  return Gpt2Bpe(encoder, encoder_json.string(), merges, vocab_bpe.string());
}

Gpt2Bpe::Gpt2Bpe(const std::string &encoder_json_text, const std::string &encoder_name,
                 const std::string &vocab_bpe_text, const std::string &bpe_name) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(encoder_json_text);
  } catch (const nlohmann::json::exception &e) {
    throw Error(TSR_ERR_INVALID,
                "encoder file '" + encoder_name + "' is not valid JSON: " + e.what());
  }
  if (!j.is_object() || j.empty())
    throw Error(TSR_ERR_INVALID, "encoder file '" + encoder_name +
                                     "' must be a JSON object of token -> id (GPT-2's "
                                     "encoder.json)");
  std::unordered_map<std::string, uint32_t> encoder;
  for (const auto &[key, value] : j.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw Error(TSR_ERR_INVALID, "encoder file '" + encoder_name + "': token '" + key +
                                       "' has id " + value.dump() +
                                       ", expected an integer in [0, 2^31)");
    const auto id = value.get<uint32_t>();
    encoder.emplace(key, id);
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  }
  // The decoder below has one entry per id up to the largest: ids far
  // beyond the token count would size it by a number from the file alone.
  if (static_cast<uint64_t>(vocab_size_) > 4 * uint64_t{encoder.size()} + 1024)
    throw Error(TSR_ERR_INVALID, "encoder file '" + encoder_name + "': the largest id is " +
                                     std::to_string(vocab_size_ - 1) + " for " +
                                     std::to_string(encoder.size()) +
                                     " tokens; ids must be (nearly) dense");
  if (auto it = encoder.find("<|endoftext|>"); it != encoder.end()) eot_ = it->second;
  decoded_.resize(static_cast<size_t>(vocab_size_));
  for (const auto &[sym, id] : encoder) decoded_[id] = byte_level_decode(sym);

  std::vector<BpeMerge> merges;
  std::istringstream in(vocab_bpe_text);
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string::npos)
      throw Error(TSR_ERR_INVALID, "BPE merges file '" + bpe_name + "' line " +
                                       std::to_string(line_no) + ": expected 'A B', got '" + line +
                                       "'");
    merges.push_back(BpeMerge{line.substr(0, sp), line.substr(sp + 1)});
  }
  if (merges.empty())
    throw Error(TSR_ERR_INVALID, "BPE merges file '" + bpe_name + "' holds no merges");
  model_ = std::make_unique<BpeModel>(std::move(encoder), merges, encoder_name, false);
  if (auto b = model_->missing_byte())
    throw Error(TSR_ERR_INVALID, "encoder file '" + encoder_name + "' has no token for byte " +
                                     std::to_string(*b) +
                                     " (a byte-level BPE vocabulary has all 256)");
}

void Gpt2Bpe::encode(std::string_view text, std::vector<uint32_t> &out) {
  for (std::string_view p : gpt2_pretokenize(text)) {
    model_->encode(p, out);
  }
}

}  // namespace tessera::data
