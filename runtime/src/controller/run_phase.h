#pragma once

// Where a run is, as one value: the phase of its current attempt, or the
// stop between two. Each phase allows a fixed set of next phases (as gloo's
// tcp::Pair states do); what a message or an exit means is read from the
// phase, not from a combination of flags.
//
//   kGathering ──> kTraining ──> kRegrouping
//       │              │              │
//       └──────> kFailing <───────────┘
//                   │
//    every phase ─> kStopping ─> kEnded        kFailing, kRegrouping ─> kRestarting
//    kRestarting ─> kBackingOff ─> kGathering  kRestarting ─> kGathering

#include <string_view>

namespace trainrun {

enum class RunPhase {
  kGathering,   // an attempt's workers start and connect; its ranks are not assigned
  kTraining,    // the ranks are assigned: train functions run and reports are recorded
  kRegrouping,  // a checkpoint was committed while node agents wait: the attempt ends to take them
  kFailing,     // a failure was recorded: the others are collected for the grace period
  kRestarting,  // the attempt's workers are being stopped for the next attempt
  kBackingOff,  // between attempts that keep failing before any report
  kStopping,    // the run is over: its workers are being stopped
  kEnded,
};

/// Whether a run may go from phase `from` to phase `to`.
constexpr bool phase_allows(RunPhase from, RunPhase to) {
  using P = RunPhase;
  if (from == P::kEnded) return false;
  if (to == P::kStopping) return from != P::kStopping;  // an interrupt or an internal error
  switch (from) {
    case P::kGathering: return to == P::kTraining || to == P::kFailing;
    case P::kTraining: return to == P::kRegrouping || to == P::kFailing;
    case P::kRegrouping: return to == P::kFailing || to == P::kRestarting;
    case P::kFailing: return to == P::kRestarting;
    case P::kRestarting: return to == P::kBackingOff || to == P::kGathering;
    case P::kBackingOff: return to == P::kGathering;
    case P::kStopping: return to == P::kEnded;
    case P::kEnded: return false;
  }
  return false;
}

/// "training", for log lines.
constexpr std::string_view to_string(RunPhase phase) {
  switch (phase) {
    case RunPhase::kGathering: return "gathering";
    case RunPhase::kTraining: return "training";
    case RunPhase::kRegrouping: return "regrouping";
    case RunPhase::kFailing: return "failing";
    case RunPhase::kRestarting: return "restarting";
    case RunPhase::kBackingOff: return "backing off";
    case RunPhase::kStopping: return "stopping";
    case RunPhase::kEnded: return "ended";
  }
  return "unknown";
}

}  // namespace trainrun
