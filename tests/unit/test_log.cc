// The fields of parallaxd's log lines (daemon/common/log.h): logfmt after the text, and the
// journal's fields when stderr is the journal.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "daemon/common/log.h"

using namespace px;

TEST_CASE("log: fields as logfmt after the text, this node last") {
  LogFields f = job_fields("train", "emb");
  f.step = 42;
  f.rank = 1;
  f.pid = 311;
  CHECK(log_fields_text(f, 2) == " | job=train variable=emb step=42 rank=1 pid=311 node=2");
  CHECK(log_fields_text(peer_fields(3), 0) == " | peer=3 node=0");
  CHECK(log_fields_text(LogFields{}, 0).empty());  // a line about nothing in particular
  // Values that need it are quoted, with '"' and '\' escaped; a newline becomes a space.
  CHECK(log_fields_text(job_fields("my job", "a=\"b\"\\\n"), 0) ==
        " | job=\"my job\" variable=\"a=\\\"b\\\"\\\\ \" node=0");
  // Step 0 and rank 0 are values, not unset.
  LogFields zero;
  zero.step = 0;
  zero.rank = 0;
  CHECK(log_fields_text(zero, 0) == " | step=0 rank=0 node=0");
}

TEST_CASE("log: journal fields") {
  LogFields f = job_fields("train", "emb");
  f.step = 7;
  f.peer = 1;
  std::vector<std::string> got = journal_fields(LogLevel::kWarn, f, 0, "stalled | job=train");
  std::vector<std::string> want = {"MESSAGE=stalled | job=train",
                                   "PRIORITY=4",
                                   "SYSLOG_IDENTIFIER=parallaxd",
                                   "PX_JOB=train",
                                   "PX_VARIABLE=emb",
                                   "PX_STEP=7",
                                   "PX_PEER=1",
                                   "PX_NODE=0"};
  CHECK(got == want);
  CHECK(journal_fields(LogLevel::kError, LogFields{}, 3, "x")[1] == "PRIORITY=3");
  CHECK(journal_fields(LogLevel::kDebug, LogFields{}, 3, "x").back() == "PX_NODE=3");
}
