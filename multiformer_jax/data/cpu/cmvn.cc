// fairseq's UtteranceCMVN as data_prep.features.utterance_cmvn computes it, from an
// utterance's features straight into its batch row, bit for bit the same result: the mean is
// summed in float32 and the squares in float64, frame after frame in each bin (the order of
// numpy's reduction over axis 0); the centred value is float32, divided in float64 by the
// standard deviation and rounded once to float32. Built without -ffast-math: the compiler
// may vectorise across bins, never reorder a sum.
#include <cmath>
#include <cstdint>
#include <vector>

extern "C" void UtteranceCmvn(const float* source, float* out, int64_t frames, int64_t bins) {
  std::vector<float> sum(bins, 0.0f);
  std::vector<double> squares(bins, 0.0);
  for (int64_t t = 0; t < frames; ++t) {
    const float* row = source + t * bins;
    for (int64_t j = 0; j < bins; ++j) {
      sum[j] += row[j];
      const double x = row[j];
      squares[j] += x * x;                         // exact: a float32 squared fits a double
    }
  }
  std::vector<float> mean(bins);
  std::vector<double> deviation(bins);
  for (int64_t j = 0; j < bins; ++j) {
    mean[j] = sum[j] / static_cast<float>(frames);
    const double m = mean[j];
    const double var = squares[j] / static_cast<double>(frames) - m * m;
    deviation[j] = std::sqrt(var > 1e-10 ? var : 1e-10);
  }
  for (int64_t t = 0; t < frames; ++t) {
    const float* row = source + t * bins;
    float* target = out + t * bins;
    for (int64_t j = 0; j < bins; ++j) {
      const float centred = row[j] - mean[j];
      target[j] = static_cast<float>(static_cast<double>(centred) / deviation[j]);
    }
  }
}
