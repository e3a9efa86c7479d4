// Collation into graph batches and the data loader's ordering contracts.

#include "crucible/common/error.h"
#include "crucible/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace crucible {
namespace {

Structure cluster(int n, double offset, bool with_energy) {
  Structure s;
  s.positions = at::arange(3 * n, at::kDouble).reshape({n, 3}) * 0.7 + offset;
  s.atomic_numbers = at::full({n}, 8, at::kLong);
  s.cell = at::zeros({3, 3}, at::kDouble);
  if (with_energy) s.energy = -1.5 * n;
  s.forces = at::ones({n, 3}, at::kDouble) * offset;
  s.config_type = "c" + std::to_string(n);
  return s;
}

Structure periodic(double a) {
  Structure s;
  s.positions = at::tensor({0.0, 0.0, 0.0, 0.5 * a, 0.5 * a, 0.5 * a}, at::kDouble).reshape({2, 3});
  s.atomic_numbers = at::tensor({22, 13}, at::kLong);
  s.cell = at::eye(3, at::kDouble) * a;
  s.pbc = {true, true, true};
  s.energy = -10.0;
  s.stress = at::eye(3, at::kDouble) * 0.01;
  return s;
}

TEST(Collate, ConcatenatesAtomsAndOffsetsEdges) {
  AtomicDataset ds({cluster(3, 0.0, true), periodic(3.0), cluster(2, 10.0, false)}, 4.0);
  Batch b = ds.collate({0, 1, 2});
  EXPECT_EQ(b.num_graphs(), 3);
  EXPECT_EQ(b.num_nodes(), 7);
  EXPECT_TRUE(at::equal(b.ptr, at::tensor({0, 3, 5, 7}, at::kLong)));
  EXPECT_TRUE(at::equal(b.batch, at::tensor({0, 0, 0, 1, 1, 2, 2}, at::kLong)));
  EXPECT_TRUE(at::equal(b.num_atoms, at::tensor({3, 2, 2}, at::kLong)));
  // Every edge connects atoms of the same graph.
  auto gi = b.batch.index_select(0, b.edge_index[0]);
  auto gj = b.batch.index_select(0, b.edge_index[1]);
  EXPECT_TRUE(at::equal(gi, gj));
  int64_t e0 = ds.neighbor_list(0).num_edges(), e1 = ds.neighbor_list(1).num_edges();
  EXPECT_EQ(b.num_edges(), e0 + e1 + ds.neighbor_list(2).num_edges());
  EXPECT_TRUE(at::equal(b.edge_index.slice(1, e0, e0 + e1), ds.neighbor_list(1).edge_index + 3));
  EXPECT_TRUE(at::equal(b.has_energy, at::tensor({1, 1, 0}).to(at::kBool)));
  EXPECT_TRUE(at::equal(b.has_stress, at::tensor({0, 1, 0}).to(at::kBool)));
  EXPECT_DOUBLE_EQ(b.energy[0].item<double>(), -4.5);
  EXPECT_DOUBLE_EQ(b.energy[2].item<double>(), 0.0);
  EXPECT_TRUE(at::allclose(b.cell[1], at::eye(3, at::kDouble) * 3.0));
  EXPECT_TRUE(at::equal(b.pbc[1], at::tensor({1, 1, 1}).to(at::kBool)));
  EXPECT_TRUE(at::equal(b.pbc[0], at::tensor({0, 0, 0}).to(at::kBool)));
  EXPECT_EQ(b.config_types, (std::vector<std::string>{"c3", "Default", "c2"}));
  // Edge vectors reproduce the neighbor list's geometry.
  auto i = b.edge_index[0], j = b.edge_index[1];
  auto cell_e = b.cell.index_select(0, b.batch.index_select(0, i));
  auto r = b.positions.index_select(0, j) - b.positions.index_select(0, i) +
           at::bmm(b.shifts.unsqueeze(1), cell_e).squeeze(1);
  ASSERT_GT(b.num_edges(), 0);
  EXPECT_LT(r.norm(2, -1).max().item<double>(), 4.0);
  EXPECT_GT(b.shifts.abs().sum().item<double>(), 0.0);  // periodic images present
}

TEST(Collate, ToConvertsFloatsOnly) {
  AtomicDataset ds({cluster(3, 0.0, true)}, 2.0);
  Batch b = ds.collate({0}).to(at::kCPU, at::kFloat);
  EXPECT_EQ(b.positions.scalar_type(), at::kFloat);
  EXPECT_EQ(b.shifts.scalar_type(), at::kFloat);
  EXPECT_EQ(b.edge_index.scalar_type(), at::kLong);
  EXPECT_EQ(b.has_energy.scalar_type(), at::kBool);
}

TEST(Collate, RejectsEmptyAndMismatchedInput) {
  EXPECT_THROW(collate({}, {}), std::invalid_argument);
  Structure s = cluster(2, 0.0, true);
  EXPECT_THROW(collate({&s}, {}), std::invalid_argument);
}

std::shared_ptr<AtomicDataset> clusters(int n) {
  std::vector<Structure> v;
  for (int i = 0; i < n; ++i) v.push_back(cluster(2, static_cast<double>(i), true));
  return std::make_shared<AtomicDataset>(v, 1.0);
}

TEST(DataLoader, SizeAndDropLast) {
  auto ds = clusters(10);
  EXPECT_EQ(DataLoader(ds, {3, false, 0, false}).size(), 4);
  EXPECT_EQ(DataLoader(ds, {3, false, 0, true}).size(), 3);
  EXPECT_EQ(DataLoader(ds, {3, false, 0, false}).batch_indices(3), (std::vector<int64_t>{9}));
  EXPECT_THROW(DataLoader(ds, {0, false, 0, false}), ConfigError);
}

TEST(DataLoader, SeededShuffleIsAPermutationAndDiffersPerEpoch) {
  auto ds = clusters(20);
  DataLoader a(ds, {4, true, 7, false}), b(ds, {4, true, 7, false});
  auto e0 = a.epoch_order();
  EXPECT_EQ(e0, b.epoch_order());
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sorted[i], i);
  a.set_epoch(1);
  EXPECT_NE(a.epoch_order(), e0);
  b.set_epoch(1);
  EXPECT_EQ(a.epoch_order(), b.epoch_order());
  DataLoader c(ds, {4, true, 8, false});
  EXPECT_NE(c.epoch_order(), e0);
  // Batches of an epoch cover every structure once.
  std::set<int64_t> seen;
  for (int64_t k = 0; k < a.size(); ++k)
    for (int64_t i : a.batch_indices(k)) EXPECT_TRUE(seen.insert(i).second);
  EXPECT_EQ(seen.size(), 20u);
}

TEST(DataLoader, SetEpochStepIsOneShot) {
  DataLoader a(clusters(10), {3, true, 0, false});
  a.set_epoch_step(2);
  EXPECT_EQ(a.take_start_step(), 2);
  EXPECT_EQ(a.take_start_step(), 0);
  EXPECT_THROW(a.set_epoch_step(5), std::out_of_range);
}

TEST(RandomSplit, FractionAndDisjointness) {
  auto [train, valid] = random_split(100, 0.1, 3);
  EXPECT_EQ(train.size(), 90u);
  EXPECT_EQ(valid.size(), 10u);
  std::set<int64_t> all(train.begin(), train.end());
  for (int64_t v : valid) EXPECT_TRUE(all.insert(v).second);
  EXPECT_EQ(all.size(), 100u);
  EXPECT_EQ(random_split(100, 0.1, 3).second, valid);
  EXPECT_NE(random_split(100, 0.1, 4).second, valid);
  EXPECT_THROW(random_split(10, 1.0, 0), ConfigError);
}

}  // namespace
}  // namespace crucible
