// Completion accounting shared by the asynchronous collectives: counts the transfers an
// operation still waits for and calls done once, with the first error, when none remain.
#pragma once

#include <mutex>
#include <string>

#include "transport/collectives/ring_allreduce.h"

namespace px {

class TransferCounter {
 public:
  TransferCounter(size_t expected, CollectiveDone done)
      : outstanding_(expected), done_(std::move(done)) {}

  // One transfer finished; also forgets `never_posted` transfers that will now not happen.
  void finished(bool ok, const std::string& error, size_t never_posted = 0) {
    CollectiveDone done;
    bool all_ok;
    std::string first_error;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!ok && ok_) {
        ok_ = false;
        error_ = error;
      }
      outstanding_ -= never_posted + 1;
      if (outstanding_ != 0) return;
      done = std::move(done_);
      all_ok = ok_;
      first_error = error_;
    }
    done(all_ok, first_error);
  }

  // More transfers to wait for (posted later, while others are outstanding).
  void add(size_t more) {
    std::lock_guard<std::mutex> lock(mutex_);
    outstanding_ += more;
  }

  bool failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !ok_;
  }

 private:
  std::mutex mutex_;
  size_t outstanding_;
  bool ok_ = true;
  std::string error_;
  CollectiveDone done_;
};

}  // namespace px
