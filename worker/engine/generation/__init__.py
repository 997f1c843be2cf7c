"""The generation engine: jobs in, each step's visible output out (`engine`: `Engine`, its
settings and the protocol the engine loop needs), over the token batch (worker/engine/batch/);
a running job, its sequences and what a step shows of each (`step_output`)."""
