"""The configs of the demo, the examples and the ready benchmarks, as package data
(``presto run NAME``)."""
