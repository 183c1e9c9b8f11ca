// daemon/sparse/learning_rates.h: the rate of each push step, and the local workers'
// agreement on changes (px_set_sparse_lr).
#include <doctest/doctest.h>

#include "daemon/sparse/learning_rates.h"

using px::LearningRates;

TEST_CASE("learning rates: the registered rate until a change, then the change's") {
  LearningRates rates(0.5);
  CHECK(rates.at(0) == 0.5);
  CHECK(rates.ask(3, 0.25, 0, 2).empty());
  CHECK(rates.ask(3, 0.25, 1, 2).empty());
  CHECK(rates.ask(7, 0.125, 0, 2).empty());
  CHECK(rates.ask(7, 0.125, 1, 2).empty());
  CHECK(rates.at(2) == 0.5);
  CHECK(rates.at(3) == 0.25);
  CHECK(rates.at(6) == 0.25);
  CHECK(rates.at(7) == 0.125);
  CHECK(rates.at(1000) == 0.125);
}

TEST_CASE("learning rates: local workers must agree on a step's rate and all set it") {
  LearningRates rates(1.0);
  CHECK(rates.ask(4, 0.5, 0, 3).empty());
  // Another rate for the same step from another worker: refused, naming the first.
  std::string why = rates.ask(4, 0.2, 2, 3);
  CHECK(why.find("local worker 0 set learning rate 0.5 from push step 4, not 0.2") !=
        std::string::npos);
  CHECK(rates.at(4) == 0.5);
  // The asker alone may change its mind.
  CHECK(rates.ask(5, 0.3, 1, 3).empty());
  CHECK(rates.ask(5, 0.4, 1, 3).empty());
  CHECK(rates.at(5) == 0.4);
  // Pushing a step that has a change needs having asked for it.
  CHECK(rates.check_push(4, 0).empty());
  CHECK(rates.check_push(3, 1).empty());  // no change at step 3
  why = rates.check_push(4, 1);
  CHECK(why.find("local worker 0 set learning rate 0.5 from push step 4 and local worker 1 "
                 "pushed that step without setting it") != std::string::npos);
  CHECK(rates.asked(4, 0));
  CHECK_FALSE(rates.asked(4, 1));
  CHECK_FALSE(rates.asked(9, 0));
}

TEST_CASE("learning rates: changes far behind the newest fold into the first rate") {
  LearningRates rates(1.0);
  for (uint64_t step = 0; step < 10000; ++step) REQUIRE(rates.ask(step, 1.0 + step, 0, 1).empty());
  CHECK(rates.changes() <= 4097);
  CHECK(rates.at(9999) == 10000.0);
  CHECK(rates.at(9000) == 9001.0);
  // Steps before 9999 - 4096 folded into the first rate: the last folded change's.
  CHECK(rates.at(0) == rates.at(9999 - 4096 - 1));
  CHECK(rates.at(0) == 9999.0 - 4096);
}
