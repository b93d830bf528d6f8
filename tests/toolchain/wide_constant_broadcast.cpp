// The smallest program that GCC 12.2 miscompiles with AVX-512 (-mavx512f,
// -march=skylake-avx512, or -march=native on such a CPU) at -O2/-O3: copying
// a 32-byte constant {2, 2, 0, 0} stores [2, 2, 2, 2].
//
// The copy becomes one 256-bit integer constant, 0x2_0000000000000002 (a
// CONST_WIDE_INT that keeps only its two low 64-bit words: the upper ones are
// zero). ix86_convert_const_wide_int_to_broadcast (i386-expand.cc) turns a
// constant whose words all equal its first into a vpbroadcastq of that word,
// but it compares only the words the CONST_WIDE_INT keeps, so it takes this
// constant for a broadcast of 2. Later GCCs also require the kept words to
// span the whole mode. Any 32- or 64-byte constant of equal low words and
// zero upper words is hit, whatever the source ({1, 1, 1, 1, 0, 0, 0, 0} as
// int32, {1.0, 1.0, 0, 0} as double, ...). The broadcast is only tried when
// moves from general registers to vector registers are allowed, so
// -mtune-ctrl=^inter_unit_moves_to_vec avoids it.
//
// meson.build compiles and runs this with the project's -march: exit status
// 1 means the compiler has the bug and the workaround flag is needed.
#include <cstdio>
#include <cstdlib>
#include <cstring>

// Reads what was stored (not inlined: the caller knows the constant it meant
// to store and would print that).
__attribute__((noinline)) int check(const long long* v) {
  if (v[0] == 2 && v[1] == 2 && v[2] == 0 && v[3] == 0) return 0;
  std::printf("{2, 2, 0, 0} was stored as {%lld, %lld, %lld, %lld}\n", v[0], v[1], v[2], v[3]);
  return 1;
}

int main() {
  const long long init[4] = {2, 2, 0, 0};
  auto* v = static_cast<long long*>(std::malloc(sizeof init));
  std::memcpy(v, init, sizeof init);
  const int bad = check(v);
  std::free(v);
  return bad;
}
