// A failed check in a doctest process test keeps what its daemons said: each DaemonProcess
// then prints the end of its log as it goes (ctest --output-on-failure shows it), so a
// failure seen only in CI, under load, can be read afterwards. Linked into the doctest
// programs only; px_fault_suite, which has no doctest, keeps the flag false. A daemon that
// does not exit with 0 on its DaemonProcess's SIGTERM fails the test that owned it.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "tests/integration/harness.h"

namespace pxt {
namespace {

struct FailureListener : doctest::IReporter {
  explicit FailureListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {
    g_check_failed.store(true);
  }
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData& data) override {
    if (data.m_failed) g_check_failed.store(true);
  }
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

// A daemon that did not exit cleanly fails the test that owned it.
void fail_unclean_exit(const std::string& message) {
  if (doctest::is_running_in_test) {
    FAIL_CHECK(message);
  } else {
    fprintf(stderr, "%s\n", message.c_str());
  }
}

struct InstallUncleanExit {
  InstallUncleanExit() { g_unclean_exit = fail_unclean_exit; }
} install_unclean_exit;

}  // namespace
}  // namespace pxt

REGISTER_LISTENER("px-daemon-logs", 1, pxt::FailureListener);
