// Preemption: while a StopSignals is alive, the first SIGTERM or SIGINT only records that a
// stop was asked for (the Trainer then finishes the step, saves a checkpoint and returns), and
// a second one of either, a second or more later, ends the process at once, as if no handler
// were installed (copies arriving within a second are one signal delivered twice: by a
// scheduler to every process and by the launcher forwarding it). The handlers that were there
// before come back when it is destroyed.
//
//   StopSignals signals;                     // Trainer::Train() holds one
//   ...
//   if (StopSignals::Requested() != 0) ...   // SIGTERM or SIGINT, 0 when none
#ifndef CPPTRAIN_TRAINER_STOP_SIGNALS_H_
#define CPPTRAIN_TRAINER_STOP_SIGNALS_H_

#include <signal.h>

namespace cpptrain {

class StopSignals {
 public:
  // Installs the handlers (nested instances share them: the outermost restores).
  StopSignals();
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
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_STOP_SIGNALS_H_
