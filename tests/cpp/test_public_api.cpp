// The public C++ API as a user's program sees it: `Handle h({})` and `Handle h` compile and mean
// the default options (an internal constructor once made the first ambiguous), a handle is
// neither copyable nor movable, and the Python binding's protocol (engine/binding.hpp) is not
// part of include/deepio's types. Most checks are compile-time; examples/downstream repeats the
// first ones against the installed package.
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include <deepio/deepio.hpp>
#include <deepio/gpu.hpp>

#include "common/support.hpp"
#include "platform/fault.hpp"

namespace deepio {
namespace {

// `{}` is the options, for Handle and GdsHandle alike.
static_assert(requires { Handle({}); });
static_assert(requires { GdsHandle({}); });
static_assert(std::is_default_constructible_v<Handle>);
static_assert(!std::is_copy_constructible_v<Handle> && !std::is_move_constructible_v<Handle>);
static_assert(!std::is_copy_assignable_v<Handle> && !std::is_move_assignable_v<Handle>);
// Nothing but options makes a handle: the internal constructors are out of reach.
static_assert(!std::is_constructible_v<GdsHandle, const GdsOptions&, detail::gpu::GdsParts&&>);
static_assert(!std::is_constructible_v<Future, std::shared_ptr<detail::OpState>>);

// The binding's protocol is not in the user's types.
template <class T>
concept HasKeepAlive = requires(T t) {
  t.keep_alive;
};
template <class T>
concept HasDetached = requires(T t) {
  t.detached;
};
template <class T>
concept HasThrough = requires(T t) {
  t.through;
};
template <class T>
concept HasWith = requires(T t) {
  t.with;
};
template <class T>
concept HasMark = requires(const T& h) {
  h.mark();
};
template <class T>
concept HasGiveToWait = requires(const T& f) {
  f.give_to_wait();
};
static_assert(!HasKeepAlive<OpOptions> && !HasDetached<OpOptions>);
static_assert(!HasKeepAlive<WaitResult>);
static_assert(!HasDetached<CollectOptions> && !HasThrough<CollectOptions> && !HasWith<CollectOptions>);
static_assert(!HasMark<Handle> && !HasMark<GdsHandle>);
static_assert(!HasGiveToWait<Future>);
// GdsHandle's own state has its own names and hides none of Handle's.
static_assert(std::is_same_v<decltype(std::declval<const GdsHandle&>().stats()), HandleStats>);
static_assert(std::is_same_v<decltype(std::declval<const GdsHandle&>().options()), const HandleOptions&>);
static_assert(std::is_same_v<decltype(std::declval<const GdsHandle&>().gds_stats()), GdsStats>);
static_assert(std::is_same_v<decltype(std::declval<const GdsHandle&>().options_as_given()), const GdsOptions&>);

TEST(PublicApi, BracesAndNothingBothMeanTheDefaultOptions) {
  const Handle braces({});
  const Handle plain;
  const HandleOptions defaults;
  for (const Handle* h : {&braces, &plain}) {
    EXPECT_EQ(h->options().block_size, defaults.block_size);
    EXPECT_EQ(h->options().queue_depth, defaults.queue_depth);
    EXPECT_EQ(h->options().intra_op_parallelism, defaults.intra_op_parallelism);
    EXPECT_EQ(h->options().backend, defaults.backend);
    EXPECT_EQ(h->options().direct_io, defaults.direct_io);
    EXPECT_NE(h->backend(), BackendKind::Auto);
  }
}

TEST(PublicApi, CollectIsWaitWithoutTheThrow) {
  test::TempDir dir;
  const std::string path = dir.file("c.bin");
  const auto data = test::pattern(2 * 4096, 11);
  Handle h({.backend = BackendKind::Threads});
  h.sync_pwrite(data.data(), data.size(), path);
  detail::set_fault_hook([](const detail::FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == detail::FaultPoint::Read && s.offset == 4096) return -EIO;
    return std::nullopt;
  });
  std::vector<std::byte> a(4096), b(4096);
  h.async_pread(a.data(), a.size(), path, 0);
  h.async_pread(b.data(), b.size(), path, 4096);
  WaitResult r = h.collect();
  detail::set_fault_hook({});
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.count, 2u);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].errnum(), EIO);
  EXPECT_EQ(r.errors[0].offset(), 4096u);
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(std::memcmp(a.data(), data.data(), a.size()), 0);
  // With a deadline that does not pass, the same: everything collected, once.
  h.async_pread(a.data(), a.size(), path, 0);
  r = h.collect({.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30)});
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.count, 1u);
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(h.wait(), 0u);
}

}  // namespace
}  // namespace deepio
