#include "controller/datagram_sessions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpuha::controller {
namespace {

using ::testing::HasSubstr;

// A datagram of `session` with `key`'s MAC around `payload`.
std::string Sealed(uint64_t session, const std::string& key, const std::string& payload) {
  auto mac = common::DatagramKey::Create(key);
  EXPECT_TRUE(mac.ok()) << mac.status();
  return common::SealDatagram(session, **mac, payload);
}

std::string Beat(uint64_t seq) {
  v1::Heartbeat hb;
  hb.set_seq(seq);
  return hb.SerializeAsString();
}

TEST(DatagramSessionsTest, AnOfferedSessionsDatagramIsItsNodesHeartbeat) {
  DatagramSessions sessions;
  auto a = sessions.Start("gpu-1");
  auto b = sessions.Start("gpu-2");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->session, b->session);
  EXPECT_EQ(a->key.size(), common::kDatagramKeyBytes);
  auto beat = sessions.Verify(Sealed(b->session, b->key, Beat(7)));
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->node, "gpu-2");
  EXPECT_EQ(beat->session, b->session);
  EXPECT_EQ(beat->heartbeat.seq(), 7u);
}

TEST(DatagramSessionsTest, AnotherSessionsKeyOrAnUnknownSessionIsRefused) {
  DatagramSessions sessions;
  auto a = sessions.Start("gpu-1");
  auto b = sessions.Start("gpu-2");
  ASSERT_TRUE(a.ok() && b.ok());
  auto forged = sessions.Verify(Sealed(a->session, b->key, Beat(1)));
  EXPECT_TRUE(absl::IsPermissionDenied(forged.status())) << forged.status();
  auto unknown = sessions.Verify(Sealed(a->session ^ 1, a->key, Beat(1)));
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  EXPECT_THAT(unknown.status().message(), HasSubstr("bytes 4-11"));
  auto junk = sessions.Verify(Sealed(a->session, a->key, "\xff\xff\xff"));
  ASSERT_FALSE(junk.ok());
  EXPECT_THAT(junk.status().message(), HasSubstr("of node 'gpu-1': not a Heartbeat message"));
  auto short_one = sessions.Verify("GHB1");
  EXPECT_TRUE(absl::IsInvalidArgument(short_one.status())) << short_one.status();
}

TEST(DatagramSessionsTest, AnEndedSessionsDatagramsAreLateUntilForgotten) {
  DatagramSessions sessions;
  auto a = sessions.Start("gpu-1");
  ASSERT_TRUE(a.ok());
  const std::string datagram = Sealed(a->session, a->key, Beat(3));
  sessions.End(a->session);
  sessions.End(a->session);  // twice: remembered once
  sessions.End(0);           // none
  auto late = sessions.Verify(datagram);
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(late.status())) << late.status();
  // The newest kEndedKept ended sessions are remembered, oldest forgotten first.
  for (size_t i = 0; i < DatagramSessions::kEndedKept; ++i) {
    auto s = sessions.Start("gpu-2");
    ASSERT_TRUE(s.ok());
    sessions.End(s->session);
  }
  auto forgotten = sessions.Verify(datagram);
  ASSERT_FALSE(forgotten.ok());
  EXPECT_TRUE(absl::IsNotFound(forgotten.status())) << forgotten.status();
}

}  // namespace
}  // namespace gpuha::controller
