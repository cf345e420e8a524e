"""What runs training jobs for agents: the NeMo RL launcher (`goaltender nemo-rl`), the metrics it
streams from a run's TensorBoard files (or its stdout) into the runner, and the checkpoints it
watches to name the best one."""
