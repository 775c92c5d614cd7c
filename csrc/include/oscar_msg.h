// Numbers and shapes for TORCH_CHECK messages, formatted without iostreams. With torch 2.11 and CUDA 13 a check whose
// message streamed an integer segfaulted in these nvcc-built extensions instead of raising
// (the pack's token-count check), while messages of strings and dtypes raised as they should; std::to_string
// does not go through the stream's number formatting.
#pragma once
#include <string>

#include <c10/util/ArrayRef.h>

namespace oscar {

template <typename N>
inline std::string num(N x) {
  return std::to_string(x);
}

inline std::string shape(c10::IntArrayRef s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace oscar
