"""The service: the only room that starts, watches or signals processes (the supervisor, the trainer's
ranks and their guards, the telemetry sampler, a node of a launch without ssh), and what it needs to do
so: the run lifecycle, stall and RAM watches, diagnoses, the runs directory, the environment's doctor."""
