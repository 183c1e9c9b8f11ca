// Client <-> daemon control framing (transport/ipc/control_channel.h, control.fbs): the
// stream decoder, frame verification, every message type through finish_frame/parse_frame,
// and the blocking helpers over a real socketpair, with descriptors passed alongside.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/ipc/control_channel.h"

using namespace px;

namespace {

std::string hello_frame(const std::string& job, int32_t rank) {
  flatbuffers::FlatBufferBuilder b;
  auto name = b.CreateString(job);
  auto body = control::CreateHello(b, 0x10002, name, rank, 4, 1234, 1 << 20);
  return finish_frame(b, control::Body::Hello, body.Union());
}

std::string register_frame(const std::string& variable, uint64_t count) {
  flatbuffers::FlatBufferBuilder b;
  auto name = b.CreateString(variable);
  auto body = control::CreateRegisterDense(b, name, 7, count, 2);
  return finish_frame(b, control::Body::RegisterDense, body.Union());
}

std::string goodbye_frame() {
  flatbuffers::FlatBufferBuilder b;
  auto body = control::CreateGoodbye(b);
  return finish_frame(b, control::Body::Goodbye, body.Union());
}

uint32_t prefix_of(const std::string& frame) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<uint8_t>(frame[static_cast<size_t>(i)])) << (8 * i);
  return n;
}

std::string prefix(uint32_t n) {
  std::string p(4, '\0');
  for (int i = 0; i < 4; ++i) p[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return p;
}

// Every frame the decoder yields from stream, fed in chunks of the given sizes (cycled).
std::vector<std::string> decode(const std::string& stream, const std::vector<size_t>& chunks) {
  FrameDecoder decoder;
  std::vector<std::string> frames;
  size_t at = 0, c = 0;
  while (at < stream.size()) {
    size_t n = std::min(chunks[c++ % chunks.size()], stream.size() - at);
    decoder.append(stream.data() + at, n);
    at += n;
    std::string payload, error;
    int got;
    while ((got = decoder.next(&payload, &error)) == 1) frames.push_back(payload);
    REQUIRE_MESSAGE(got == 0, error);
  }
  return frames;
}

// A verified message and the payload it points into.
struct Parsed {
  std::unique_ptr<std::string> payload;
  const control::Message* message = nullptr;
  const control::Message* operator->() const { return message; }
};

Parsed parse_ok(const std::string& frame) {
  std::string error;
  REQUIRE(frame.size() > 4);
  REQUIRE(prefix_of(frame) == frame.size() - 4);
  Parsed p{std::make_unique<std::string>(frame.substr(4)), nullptr};
  p.message = parse_frame(*p.payload, &error);
  REQUIRE_MESSAGE(p.message != nullptr, error);
  CHECK(p.message->protocol_version() == kControlProtocolVersion);
  return p;
}

struct SocketPair {
  SocketPair() {
    int fds[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    a = fds[0];
    b = fds[1];
  }
  ~SocketPair() {
    if (a >= 0) close(a);
    if (b >= 0) close(b);
  }
  int a = -1, b = -1;
};

int64_t ms_from_now(int64_t ms) {
  return monotonic_ns() + ms * 1000000;
}

}  // namespace

TEST_CASE("control: the decoder cuts a stream fed byte by byte and in odd chunks into frames") {
  std::vector<std::string> frames = {hello_frame("job-a", 1), goodbye_frame(),
                                     register_frame(std::string(3000, 'v'), 42),
                                     hello_frame("", -1)};
  std::string stream;
  for (auto& f : frames) stream += f;
  std::vector<std::vector<size_t>> chunkings = {
      {1}, {2}, {3}, {5, 7, 11}, {4}, {1, 4096}, {stream.size()}, {13, 1, 1, 2}};
  for (auto& chunks : chunkings) {
    CAPTURE(chunks[0]);
    std::vector<std::string> got = decode(stream, chunks);
    REQUIRE(got.size() == frames.size());
    for (size_t i = 0; i < frames.size(); ++i) CHECK(got[i] == frames[i].substr(4));
  }

  SUBCASE("nothing is cut before a frame is complete") {
    FrameDecoder decoder;
    std::string frame = register_frame("x", 1), payload, error;
    for (size_t i = 0; i + 1 < frame.size(); ++i) {
      decoder.append(&frame[i], 1);
      REQUIRE(decoder.next(&payload, &error) == 0);
    }
    decoder.append(&frame.back(), 1);
    CHECK(decoder.next(&payload, &error) == 1);
    CHECK(payload == frame.substr(4));
    CHECK(decoder.next(&payload, &error) == 0);  // and nothing is left over
  }
}

TEST_CASE("control: a length prefix of zero or above kMaxControlFrameBytes is refused") {
  std::string payload, error;
  SUBCASE("zero") {
    FrameDecoder decoder;
    std::string p = prefix(0);
    decoder.append(p.data(), p.size());
    CHECK(decoder.next(&payload, &error) == -1);
    CHECK(error == "control frame length 0 out of range");
  }
  SUBCASE("one above the maximum, refused before its body arrives") {
    FrameDecoder decoder;
    std::string p = prefix(kMaxControlFrameBytes + 1);
    decoder.append(p.data(), 3);
    CHECK(decoder.next(&payload, &error) == 0);  // three bytes of the prefix: wait
    decoder.append(p.data() + 3, 1);
    CHECK(decoder.next(&payload, &error) == -1);
    CHECK(error ==
          "control frame length " + std::to_string(kMaxControlFrameBytes + 1) + " out of range");
  }
  SUBCASE("0xffffffff") {
    FrameDecoder decoder;
    std::string p = prefix(0xffffffffu);
    decoder.append(p.data(), p.size());
    CHECK(decoder.next(&payload, &error) == -1);
    CHECK(error.find("4294967295") != std::string::npos);
  }
  SUBCASE("exactly the maximum is a frame") {
    FrameDecoder decoder;
    std::string stream = prefix(kMaxControlFrameBytes) + std::string(kMaxControlFrameBytes, 'z');
    decoder.append(stream.data(), stream.size() - 1);
    CHECK(decoder.next(&payload, &error) == 0);
    decoder.append(stream.data() + stream.size() - 1, 1);
    CHECK(decoder.next(&payload, &error) == 1);
    CHECK(payload.size() == kMaxControlFrameBytes);
  }
  SUBCASE("a bad prefix after a good frame: the good one still comes out first") {
    FrameDecoder decoder;
    std::string stream = goodbye_frame() + prefix(0);
    decoder.append(stream.data(), stream.size());
    CHECK(decoder.next(&payload, &error) == 1);
    CHECK(decoder.next(&payload, &error) == -1);
  }
}

TEST_CASE("control: parse_frame refuses garbage, truncated and wrong-version payloads") {
  std::string error;
  SUBCASE("empty and garbage") {
    CHECK(parse_frame("", &error) == nullptr);
    CHECK(error == "control frame is not a valid message");
    error.clear();
    CHECK(parse_frame(std::string(64, '\xff'), &error) == nullptr);
    CHECK(error == "control frame is not a valid message");
    error.clear();
    CHECK(parse_frame("hello, parallaxd", &error) == nullptr);
    CHECK(error == "control frame is not a valid message");
  }
  SUBCASE("every truncation of a valid message") {
    // Cutting into what the message uses is refused; only the builder's alignment padding
    // at the very end can go unnoticed, and then the message reads the same.
    for (const std::string& frame :
         {hello_frame("a-job-with-a-name", 3), register_frame("weights", 1000)}) {
      std::string payload = frame.substr(4);
      const auto* whole = parse_frame(payload, &error);
      REQUIRE(whole);
      for (size_t n = 0; n < payload.size(); ++n) {
        CAPTURE(n);
        error.clear();
        std::string cut = payload.substr(0, n);
        const control::Message* m = parse_frame(cut, &error);
        if (!m) {
          CHECK(!error.empty());
          continue;
        }
        CHECK(n + 8 > payload.size());  // padding is less than one 8-byte word
        REQUIRE(m->body_type() == whole->body_type());
        if (const auto* h = m->body_as_Hello()) {
          CHECK(h->job()->str() == "a-job-with-a-name");
          CHECK(h->local_rank() == 3);
        } else {
          const auto* r = m->body_as_RegisterDense();
          REQUIRE(r);
          CHECK(r->name()->str() == "weights");
          CHECK(r->count() == 1000);
        }
      }
    }
  }
  SUBCASE("another protocol version") {
    flatbuffers::FlatBufferBuilder b;
    auto body = control::CreateGoodbye(b);
    b.Finish(control::CreateMessage(b, kControlProtocolVersion + 1, control::Body::Goodbye,
                                    body.Union()));
    std::string payload(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
    CHECK(parse_frame(payload, &error) == nullptr);
    CHECK(error == "control protocol version " + std::to_string(kControlProtocolVersion + 1) +
                       " (expected " + std::to_string(kControlProtocolVersion) + ")");
    flatbuffers::FlatBufferBuilder zero;  // protocol_version left out: 0
    auto body0 = control::CreateGoodbye(zero);
    control::MessageBuilder m(zero);
    m.add_body_type(control::Body::Goodbye);
    m.add_body(body0.Union());
    zero.Finish(m.Finish());
    payload.assign(reinterpret_cast<const char*>(zero.GetBufferPointer()), zero.GetSize());
    CHECK(parse_frame(payload, &error) == nullptr);
    CHECK(error.find("control protocol version 0") == 0);
  }
  SUBCASE("no body") {
    flatbuffers::FlatBufferBuilder b;
    control::MessageBuilder m(b);
    m.add_protocol_version(kControlProtocolVersion);
    b.Finish(m.Finish());
    std::string payload(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
    CHECK(parse_frame(payload, &error) == nullptr);
    CHECK(error == "control message has no body");
  }
}

TEST_CASE("control: every message type survives finish_frame and parse_frame") {
  SUBCASE("Hello") {
    auto m = parse_ok(hello_frame("train", 2));
    REQUIRE(m->body_type() == control::Body::Hello);
    const auto* h = m->body_as_Hello();
    CHECK(h->abi_version() == 0x10002);
    CHECK(h->job()->str() == "train");
    CHECK(h->local_rank() == 2);
    CHECK(h->local_size() == 4);
    CHECK(h->pid() == 1234);
    CHECK(h->arena_bytes() == 1u << 20);
    flatbuffers::FlatBufferBuilder b;  // local_rank left out: -1
    auto job = b.CreateString("j");
    control::HelloBuilder hb(b);
    hb.add_job(job);
    auto body = hb.Finish();
    auto parsed_d = parse_ok(finish_frame(b, control::Body::Hello, body.Union()));
    const auto* d = parsed_d->body_as_Hello();
    CHECK(d->local_rank() == -1);
  }
  SUBCASE("HelloReply") {
    flatbuffers::FlatBufferBuilder b;
    auto text = b.CreateString("welcome");
    auto body = control::CreateHelloReply(b, -3, text, 0x10001, 1, 2, 5, 8, 1, 4);
    auto parsed_r = parse_ok(finish_frame(b, control::Body::HelloReply, body.Union()));
    const auto* r = parsed_r->body_as_HelloReply();
    REQUIRE(r);
    CHECK(r->status() == -3);
    CHECK(r->message()->str() == "welcome");
    CHECK(r->daemon_abi_version() == 0x10001);
    CHECK(r->node_index() == 1);
    CHECK(r->node_count() == 2);
    CHECK(r->rank() == 5);
    CHECK(r->world_size() == 8);
    CHECK(r->local_rank() == 1);
    CHECK(r->local_size() == 4);
  }
  SUBCASE("RegisterDense") {
    auto parsed_r = parse_ok(register_frame("layer1/w", 1ull << 33));
    const auto* r = parsed_r->body_as_RegisterDense();
    REQUIRE(r);
    CHECK(r->name()->str() == "layer1/w");
    CHECK(r->dtype() == 7);
    CHECK(r->count() == 1ull << 33);
    CHECK(r->op() == 2);
  }
  SUBCASE("RegisterSparse with its options") {
    flatbuffers::FlatBufferBuilder b;
    auto name = b.CreateString("embeddings");
    auto options = control::CreateSparseOptions(b, 2, 0.01, 0.9, 0.999, 1e-8, 0.1, 3, 77, -0.5, 0.5,
                                                0.02, 1, 2, 4, 16, 1, 2);
    auto body = control::CreateRegisterSparse(b, name, 0, 1000000, 64, options);
    auto parsed_r = parse_ok(finish_frame(b, control::Body::RegisterSparse, body.Union()));
    const auto* r = parsed_r->body_as_RegisterSparse();
    REQUIRE(r);
    CHECK(r->name()->str() == "embeddings");
    CHECK(r->rows() == 1000000);
    CHECK(r->dim() == 64);
    const auto* o = r->options();
    REQUIRE(o);
    CHECK(o->optimizer() == 2);
    CHECK(o->learning_rate() == 0.01);
    CHECK(o->beta1() == 0.9);
    CHECK(o->beta2() == 0.999);
    CHECK(o->epsilon() == 1e-8);
    CHECK(o->initial_accumulator() == 0.1);
    CHECK(o->initializer() == 3);
    CHECK(o->init_seed() == 77);
    CHECK(o->init_low() == -0.5);
    CHECK(o->init_high() == 0.5);
    CHECK(o->init_std() == 0.02);
    CHECK(o->aggregation() == 1);
    CHECK(o->consistency() == 2);
    CHECK(o->staleness() == 4);
    CHECK(o->partitions() == 16);
    CHECK(o->route() == 1);
    CHECK(o->nonfinite() == 2);
  }
  SUBCASE("RegisterReply") {
    flatbuffers::FlatBufferBuilder b;
    auto text = b.CreateString("");
    auto body = control::CreateRegisterReply(b, 0, text, 9);
    auto parsed_r = parse_ok(finish_frame(b, control::Body::RegisterReply, body.Union()));
    const auto* r = parsed_r->body_as_RegisterReply();
    REQUIRE(r);
    CHECK(r->status() == 0);
    CHECK(r->message()->str().empty());
    CHECK(r->var_id() == 9);
  }
  SUBCASE("StatsRequest and StatsReply") {
    flatbuffers::FlatBufferBuilder b;
    auto body = control::CreateStatsRequest(b, 12);
    auto parsed_q = parse_ok(finish_frame(b, control::Body::StatsRequest, body.Union()));
    const auto* q = parsed_q->body_as_StatsRequest();
    REQUIRE(q);
    CHECK(q->var_id() == 12);
    flatbuffers::FlatBufferBuilder c;
    auto text = c.CreateString("ok");
    auto reply = control::CreateStatsReply(c, 0, text, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                           0xffffffffffffffffull);
    auto parsed_r = parse_ok(finish_frame(c, control::Body::StatsReply, reply.Union()));
    const auto* r = parsed_r->body_as_StatsReply();
    REQUIRE(r);
    CHECK(r->message()->str() == "ok");
    CHECK(r->ops() == 1);
    CHECK(r->bytes() == 2);
    CHECK(r->wait_ns() == 3);
    CHECK(r->reduce_ns() == 4);
    CHECK(r->pull_steps() == 5);
    CHECK(r->push_steps() == 6);
    CHECK(r->rows_pulled() == 7);
    CHECK(r->rows_unique() == 8);
    CHECK(r->rows_applied() == 9);
    CHECK(r->bytes_sent() == 10);
    CHECK(r->bytes_received() == 11);
    CHECK(r->request_partitions() == 12);
    CHECK(r->search_steps_left() == 0xffffffffffffffffull);
  }
  SUBCASE("Checkpoint and CheckpointReply") {
    flatbuffers::FlatBufferBuilder b;
    auto path = b.CreateString("/ckpt/run-1");
    auto body = control::CreateCheckpoint(b, path, 30000);
    auto parsed_q = parse_ok(finish_frame(b, control::Body::Checkpoint, body.Union()));
    const auto* q = parsed_q->body_as_Checkpoint();
    REQUIRE(q);
    CHECK(q->path()->str() == "/ckpt/run-1");
    CHECK(q->timeout_ms() == 30000);
    flatbuffers::FlatBufferBuilder c;
    auto text = c.CreateString("disk full");
    auto reply = control::CreateCheckpointReply(c, -7, text);
    auto parsed_r = parse_ok(finish_frame(c, control::Body::CheckpointReply, reply.Union()));
    const auto* r = parsed_r->body_as_CheckpointReply();
    REQUIRE(r);
    CHECK(r->status() == -7);
    CHECK(r->message()->str() == "disk full");
  }
  SUBCASE("Goodbye") {
    auto m = parse_ok(goodbye_frame());
    CHECK(m->body_type() == control::Body::Goodbye);
    CHECK(m->body_as_Goodbye() != nullptr);
  }
}

TEST_CASE("control: frames and descriptors over a socketpair") {
  SocketPair s;
  std::string error;
  bool timed_out = true;
  FrameDecoder decoder;
  std::string payload;
  std::vector<int> fds;

  SUBCASE("two frames, then the second from the decoder without touching the socket") {
    std::string frames = hello_frame("j", 0) + goodbye_frame();
    REQUIRE(send_frame_blocking(s.a, frames, ms_from_now(5000), &error, &timed_out));
    CHECK_FALSE(timed_out);
    REQUIRE(
        recv_frame_blocking(s.b, decoder, &payload, &fds, ms_from_now(5000), &error, &timed_out));
    CHECK(payload == hello_frame("j", 0).substr(4));
    // The deadline has passed already: the second frame must come out of the decoder.
    REQUIRE(
        recv_frame_blocking(s.b, decoder, &payload, &fds, monotonic_ns() - 1, &error, &timed_out));
    CHECK(payload == goodbye_frame().substr(4));
    CHECK(fds.empty());
  }

  SUBCASE("descriptors passed with SCM_RIGHTS refer to the same files") {
    int pipe_fds[2];
    REQUIRE(pipe2(pipe_fds, O_CLOEXEC) == 0);
    int memfd = memfd_create("px-unit", MFD_CLOEXEC);
    REQUIRE(memfd >= 0);
    std::string frame = hello_frame("with-fds", 1);
    int send_fds[3] = {memfd, pipe_fds[0], pipe_fds[1]};
    // The daemon's way: the fds ride on the first bytes, the rest follows.
    ssize_t sent = send_with_fds(s.a, frame.data(), 10, send_fds, 3);
    REQUIRE(sent == 10);
    REQUIRE(send_frame_blocking(s.a, frame.substr(10), ms_from_now(5000), &error, &timed_out));
    REQUIRE(
        recv_frame_blocking(s.b, decoder, &payload, &fds, ms_from_now(5000), &error, &timed_out));
    CHECK(payload == frame.substr(4));
    REQUIRE(fds.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      struct stat mine, theirs;
      REQUIRE(fstat(send_fds[i], &mine) == 0);
      REQUIRE(fstat(fds[i], &theirs) == 0);
      CHECK(mine.st_ino == theirs.st_ino);
      CHECK(mine.st_dev == theirs.st_dev);
      CHECK(fds[i] != send_fds[i]);
      CHECK((fcntl(fds[i], F_GETFD) & FD_CLOEXEC) != 0);  // MSG_CMSG_CLOEXEC
    }
    // The received pipe ends work: write on ours, read on theirs.
    REQUIRE(write(pipe_fds[1], "ok", 2) == 2);
    char buf[2];
    REQUIRE(read(fds[1], buf, 2) == 2);
    CHECK(std::string(buf, 2) == "ok");
    for (int fd : fds) close(fd);
    for (int fd : send_fds) close(fd);
  }

  SUBCASE("descriptors nobody asked for are closed, not leaked") {
    int memfd = memfd_create("px-unit-unwanted", MFD_CLOEXEC);
    REQUIRE(memfd >= 0);
    struct stat st;
    REQUIRE(fstat(memfd, &st) == 0);
    std::string frame = goodbye_frame();
    REQUIRE(send_with_fds(s.a, frame.data(), frame.size(), &memfd, 1) ==
            static_cast<ssize_t>(frame.size()));
    close(memfd);
    // The next free descriptor number, before and after: a leaked one would take it.
    int probe = dup(s.a);
    REQUIRE(probe >= 0);
    close(probe);
    REQUIRE(recv_frame_blocking(s.b, decoder, &payload, nullptr, ms_from_now(5000), &error,
                                &timed_out));
    int after = dup(s.a);
    CHECK(after == probe);
    close(after);
  }

  SUBCASE("more descriptors than kMaxFdsPerFrame are refused") {
    int many[kMaxFdsPerFrame + 1];
    for (int& fd : many) fd = 0;
    errno = 0;
    CHECK(send_with_fds(s.a, "x", 1, many, kMaxFdsPerFrame + 1) == -1);
    CHECK(errno == EINVAL);
  }

  SUBCASE("a frame larger than the socket buffer, read by another thread") {
    int small = 4096;
    REQUIRE(setsockopt(s.a, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    REQUIRE(setsockopt(s.b, SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
    std::string frame = register_frame(std::string(60000, 'n'), 5);
    REQUIRE(frame.size() - 4 <= kMaxControlFrameBytes);
    std::string got, reader_error;
    bool reader_ok = false, reader_timed_out = true;
    std::thread reader([&] {
      FrameDecoder d;
      reader_ok = recv_frame_blocking(s.b, d, &got, nullptr, ms_from_now(10000), &reader_error,
                                      &reader_timed_out);
    });
    bool ok = send_frame_blocking(s.a, frame, ms_from_now(10000), &error, &timed_out);
    reader.join();
    CHECK_MESSAGE(ok, error);
    CHECK_MESSAGE(reader_ok, reader_error);
    CHECK_FALSE(reader_timed_out);
    CHECK(got == frame.substr(4));
  }

  SUBCASE("a peer that sends nothing: the deadline passes, timed_out is set") {
    int64_t start = monotonic_ns();
    CHECK_FALSE(
        recv_frame_blocking(s.b, decoder, &payload, &fds, ms_from_now(100), &error, &timed_out));
    CHECK(timed_out);
    CHECK(error == "timed out waiting for parallaxd");
    CHECK(monotonic_ns() - start >= 100 * 1000000 - 1000000);  // poll rounds up to whole ms
  }

  SUBCASE("a peer that sends half a frame: still a time-out") {
    std::string frame = hello_frame("half", 0);
    REQUIRE(send_frame_blocking(s.a, frame.substr(0, frame.size() / 2), ms_from_now(5000), &error,
                                &timed_out));
    CHECK_FALSE(
        recv_frame_blocking(s.b, decoder, &payload, &fds, ms_from_now(50), &error, &timed_out));
    CHECK(timed_out);
    // The rest arrives: the frame is whole.
    REQUIRE(send_frame_blocking(s.a, frame.substr(frame.size() / 2), ms_from_now(5000), &error,
                                &timed_out));
    REQUIRE(
        recv_frame_blocking(s.b, decoder, &payload, &fds, ms_from_now(5000), &error, &timed_out));
    CHECK_FALSE(timed_out);
    CHECK(payload == frame.substr(4));
  }

  SUBCASE("a peer that reads nothing: sending times out") {
    std::string frame = register_frame(std::string(60000, 's'), 1);
    bool ok = true;
    // The socket buffers fill up after a few frames; then the deadline passes.
    for (int i = 0; i < 1000 && ok; ++i)
      ok = send_frame_blocking(s.a, frame, ms_from_now(50), &error, &timed_out);
    CHECK_FALSE(ok);
    CHECK(timed_out);
    CHECK(error == "timed out sending to parallaxd");
  }

  SUBCASE("the peer closes: an error, not a time-out") {
    close(s.a);
    s.a = -1;
    CHECK_FALSE(
        recv_frame_blocking(s.b, decoder, &payload, &fds, ms_from_now(5000), &error, &timed_out));
    CHECK_FALSE(timed_out);
    CHECK(error == "parallaxd closed the connection");
    CHECK_FALSE(send_frame_blocking(s.b, goodbye_frame(), ms_from_now(5000), &error, &timed_out));
    CHECK_FALSE(timed_out);
    CHECK(error.find("sending to parallaxd: ") == 0);
  }

  SUBCASE("a bad length prefix on the socket: an error, not a time-out") {
    std::string bad = prefix(kMaxControlFrameBytes + 1) + "xxxx";
    REQUIRE(send_frame_blocking(s.a, bad, ms_from_now(5000), &error, &timed_out));
    CHECK_FALSE(
        recv_frame_blocking(s.b, decoder, &payload, &fds, ms_from_now(5000), &error, &timed_out));
    CHECK_FALSE(timed_out);
    CHECK(error.find("out of range") != std::string::npos);
  }
}
