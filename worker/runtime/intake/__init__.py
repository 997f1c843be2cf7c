"""How jobs come in from RQ: the slot threads that take them (`slots`), the one job class they run,
data naming a job function and nothing imported by name (`fixed_job`), and how a slot takes a job
the API placed (`placed_take`)."""
