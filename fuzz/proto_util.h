// Message equality for the fuzz targets' round-trip checks (fuzz/*_fuzzer.cc): as
// MessageDifferencer::Equals, except that NaN equals NaN (the text format reads and prints nan,
// and a parsed nan must not read as a changed value).
#ifndef CPPTRAIN_FUZZ_PROTO_UTIL_H_
#define CPPTRAIN_FUZZ_PROTO_UTIL_H_

#include "google/protobuf/message.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/message_differencer.h"

namespace cpptrain {
namespace fuzz {

inline bool SameMessage(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  return differencer.Compare(a, b);
}

}  // namespace fuzz
}  // namespace cpptrain

#endif  // CPPTRAIN_FUZZ_PROTO_UTIL_H_
