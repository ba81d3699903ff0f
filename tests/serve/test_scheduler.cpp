// Scheduler: FIFO admission by free KV pages, placement on the least-loaded rank, 429 / 400 / 503
// answers, cancels and finishes returning pages, drain and failure; the step plan's bytes round
// trip. Expected values are worked out by hand from the page rule ceil((prompt + max_new) / 64).
#include <gtest/gtest.h>

#include <memory>

#include "serve/scheduler.h"

namespace deepinfer::serve {
namespace {

std::shared_ptr<Job> job(int64_t prompt_len, int64_t max_new) {
  auto j = std::make_shared<Job>();
  j->req.prompt.assign(size_t(prompt_len), 7);
  j->req.max_new_tokens = max_new;
  return j;
}

SchedulerOptions opts(int world, int64_t pages, int64_t max_batch = 8, int64_t max_queue = 8) {
  SchedulerOptions o;
  o.world = world;
  o.pages_per_rank = pages;
  o.max_batch = max_batch;
  o.max_queue = max_queue;
  o.heartbeat_s = 0.01;
  return o;
}

runtime::StepEvent finish(int64_t id, int32_t token, const char* reason) {
  runtime::StepEvent e;
  e.id = id;
  e.token = token;
  e.finished = true;
  e.result.finish_reason = reason;
  return e;
}

TEST(Scheduler, AdmitsInFifoOrderByPagesAndPlacesOnTheLeastLoadedRank) {
  Scheduler s(opts(2, 4));
  auto a = job(100, 28), b = job(200, 56), c = job(10, 10), d = job(10, 10);
  // a: 2 pages, b: 4 pages, c and d: 1 page each.
  for (auto& j : {a, b, c, d}) ASSERT_EQ(s.submit(j), Admission::queued);
  const StepPlan p = s.next_plan();
  // a -> rank 0 (tie: the lower rank), b -> rank 1 (rank 0 has 2 pages left), c -> rank 0 (both
  // run one; rank 0 has the free pages), d -> rank 0 (its last page).
  ASSERT_EQ(p.starts.size(), 4u);
  EXPECT_EQ(p.starts[0].req.id, a->req.id);
  EXPECT_EQ(p.starts[0].rank, 0);
  EXPECT_EQ(p.starts[1].req.id, b->req.id);
  EXPECT_EQ(p.starts[1].rank, 1);
  EXPECT_EQ(p.starts[2].req.id, c->req.id);
  EXPECT_EQ(p.starts[2].rank, 0);
  EXPECT_EQ(p.starts[3].req.id, d->req.id);
  EXPECT_EQ(p.starts[3].rank, 0);
  EXPECT_TRUE(p.run);
  EXPECT_FALSE(p.stop);
  auto snap = s.snapshot();
  EXPECT_EQ(snap.running, 4);
  EXPECT_EQ(snap.queued, 0);
  EXPECT_EQ(snap.pages_used, 8);
  EXPECT_EQ(snap.pages_free, 0);
  EXPECT_EQ(s.submit(job(1, 1)), Admission::queued);
  EXPECT_TRUE(s.next_plan().starts.empty());  // no page left anywhere: it waits
}

TEST(Scheduler, TheQueueHeadBlocksThoseBehindIt) {
  Scheduler s(opts(1, 4));
  auto big = job(64 * 3, 64), small = job(1, 1), small2 = job(1, 1);
  ASSERT_EQ(s.submit(small), Admission::queued);
  ASSERT_EQ(s.submit(big), Admission::queued);  // 4 pages: waits for small
  ASSERT_EQ(s.submit(small2), Admission::queued);
  StepPlan p = s.next_plan();
  ASSERT_EQ(p.starts.size(), 1u);
  EXPECT_EQ(p.starts[0].req.id, small->req.id);
  EXPECT_EQ(s.snapshot().queued, 2);
  s.deliver({finish(small->req.id, 5, "length")});
  EXPECT_TRUE(small->finished);
  EXPECT_EQ(small->tokens, std::vector<int32_t>{5});
  p = s.next_plan();
  ASSERT_EQ(p.starts.size(), 1u);
  EXPECT_EQ(p.starts[0].req.id, big->req.id);
  EXPECT_EQ(s.snapshot().pages_free, 0);
}

TEST(Scheduler, AnswersQueueFullNeverFitsAndStopping) {
  Scheduler s(opts(1, 2, 1, 1));
  EXPECT_EQ(s.submit(job(64 * 2, 1)), Admission::never_fits);  // 3 pages > 2
  ASSERT_EQ(s.submit(job(10, 10)), Admission::queued);
  EXPECT_EQ(s.submit(job(10, 10)), Admission::queue_full);
  s.drain(10);
  EXPECT_EQ(s.submit(job(10, 10)), Admission::stopping);
}

TEST(Scheduler, CancelsFreePagesBeforeTheNextStep) {
  Scheduler s(opts(2, 2));
  auto a = job(10, 10), b = job(10, 10);
  s.submit(a);
  s.submit(b);
  StepPlan p = s.next_plan();
  ASSERT_EQ(p.starts.size(), 2u);
  EXPECT_EQ(s.snapshot().pages_used, 2);
  s.cancel(*a);
  p = s.next_plan();
  ASSERT_EQ(p.cancels.size(), 1u);
  EXPECT_EQ(p.cancels[0].id, a->req.id);
  EXPECT_EQ(p.cancels[0].rank, 0);  // a ran on rank 0, b on rank 1
  EXPECT_TRUE(a->finished);
  EXPECT_EQ(a->finish_reason, "cancelled");
  EXPECT_EQ(s.snapshot().pages_used, 1);
  EXPECT_EQ(s.snapshot().running, 1);
  // A token for the cancelled id (it ran in the same step) is dropped.
  s.deliver({finish(a->req.id, 3, "length")});
  EXPECT_TRUE(a->tokens.empty());
}

TEST(Scheduler, DrainStopsWhenEmptyAndEndsLateJobsWithAnError) {
  Scheduler s(opts(1, 4));
  auto a = job(10, 10);
  s.submit(a);
  s.next_plan();
  s.drain(0);  // no time left: running jobs end now
  StepPlan p = s.next_plan();
  EXPECT_EQ(p.cancels.size(), 1u);
  EXPECT_TRUE(p.stop);
  EXPECT_TRUE(a->finished);
  EXPECT_FALSE(a->error.empty());

  Scheduler t(opts(1, 4));
  auto b = job(10, 10);
  t.submit(b);
  t.next_plan();
  t.drain(60);
  p = t.next_plan();
  EXPECT_FALSE(p.stop);  // b still runs
  t.deliver({finish(b->req.id, 1, "stop")});
  p = t.next_plan();
  EXPECT_TRUE(p.stop);
  EXPECT_EQ(b->finish_reason, "stop");
  EXPECT_TRUE(b->error.empty());
}

TEST(Scheduler, FailAllEndsEveryJobWithTheError) {
  Scheduler s(opts(1, 1));
  auto a = job(10, 10), b = job(10, 10);
  s.submit(a);
  s.submit(b);
  s.next_plan();  // a runs, b waits
  s.fail_all("rank 1 died");
  EXPECT_EQ(a->error, "rank 1 died");
  EXPECT_EQ(b->error, "rank 1 died");
  EXPECT_TRUE(s.next_plan().stop);
  EXPECT_EQ(s.submit(job(1, 1)), Admission::stopping);
}

TEST(StepPlan, RoundTripsThroughBytes) {
  StepPlan p;
  p.run = true;
  StepPlan::Start st;
  st.rank = 3;
  st.req.id = 42;
  st.req.prompt = {1, 2, 3};
  st.req.max_new_tokens = 9;
  st.req.sampling = {0.5f, 7, 0.9f, 1234};
  st.req.stop_ids = {1};
  p.starts.push_back(st);
  p.cancels.push_back({2, 17});
  const StepPlan q = decode_plan(encode_plan(p));
  EXPECT_TRUE(q.run);
  EXPECT_FALSE(q.stop);
  ASSERT_EQ(q.starts.size(), 1u);
  EXPECT_EQ(q.starts[0].rank, 3);
  EXPECT_EQ(q.starts[0].req.id, 42);
  EXPECT_EQ(q.starts[0].req.prompt, st.req.prompt);
  EXPECT_EQ(q.starts[0].req.max_new_tokens, 9);
  EXPECT_EQ(q.starts[0].req.sampling.top_k, 7);
  EXPECT_EQ(q.starts[0].req.sampling.seed, 1234u);
  EXPECT_EQ(q.starts[0].req.stop_ids, st.req.stop_ids);
  ASSERT_EQ(q.cancels.size(), 1u);
  EXPECT_EQ(q.cancels[0].rank, 2);
  EXPECT_EQ(q.cancels[0].id, 17);
  auto bytes = encode_plan(p);
  bytes.pop_back();
  EXPECT_THROW(decode_plan(bytes), Error);
}

}  // namespace
}  // namespace deepinfer::serve
