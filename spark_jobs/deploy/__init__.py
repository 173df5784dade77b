"""Where a job runs: the Spark session and ``spark-submit`` command, the standalone
cluster harness, the Java check and the deployment's settings."""
