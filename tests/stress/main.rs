//! Stress on real threads: many tasks under one tree with random cancels and panics, and a
//! first ticket racing a cancel and a quarantine, round after round (`STRESS_ROUNDS` sets how
//! many).

mod quiesce;
