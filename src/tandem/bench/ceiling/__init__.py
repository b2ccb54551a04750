"""`tandem bench-ceiling`: how fast a recorded run's answers could have decoded.

- `oracle`: the copy ceiling (an oracle drafting the longest verbatim run of the answer) and a
  plain suffix matcher, priced on the target's measured verify curve.
- `drafting_replay`: Tandem's own copy drafting and depth planner replayed on the same answers,
  priced on the same curves.
- `report`: the table per category, measured against both.
"""
