// Preemption: while a StopSignals is alive, the first SIGTERM or SIGINT only records that a
// stop was asked for (the Trainer then finishes the step, saves a checkpoint and returns), and
// a second one of either, a second or more later, ends the process at once, as if no handler
// were installed (copies arriving within a second are one signal delivered twice: by a
// scheduler to every process and by the launcher forwarding it). A process still alive `grace`
// after the first request (a step or a save stuck, say on a peer that died) says so on stderr
// and ends the same way: a stop request is never ignored for longer than that. The handlers
// that were there before (SIGTERM, SIGINT, SIGALRM, which carries the grace period) come back
// when it is destroyed.
//
//   CT_ASSIGN_OR_RETURN(absl::Duration grace, StopGraceFromEnvironment());
//   StopSignals signals(grace);              // Trainer::Train() holds one
//   ...
//   if (StopSignals::Requested() != 0) ...   // SIGTERM or SIGINT, 0 when none
#ifndef CPPTRAIN_TRAINER_STOP_SIGNALS_H_
#define CPPTRAIN_TRAINER_STOP_SIGNALS_H_

#include <signal.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cpptrain {

// The grace period of a stop request: CPPTRAIN_STOP_GRACE_S in whole seconds (0: none, wait as
// long as the step and the save take), 60 s when unset; an error naming the value otherwise.
absl::StatusOr<absl::Duration> StopGraceFromEnvironment();

class StopSignals {
 public:
  // Installs the handlers (nested instances share them: the outermost restores and its grace
  // period applies). A zero grace period waits without limit.
  explicit StopSignals(absl::Duration grace = absl::Seconds(60));
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received since the outermost StopSignals was created, or 0.
  static int Requested();
  // Forgets a request (for tests and for a Trainer that trains again).
  static void Clear();

 private:
  bool installed_ = false;
  struct sigaction previous_term_ {};
  struct sigaction previous_int_ {};
  struct sigaction previous_alarm_ {};
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_STOP_SIGNALS_H_
