"""A Structured Streaming query that applies changelog files through ChangelogSink (run as a child process by tests).

    python changelog_stream_job.py WAREHOUSE TABLE INPUT_DIR CHECKPOINT LOG [KILL_AFTER_BATCH]

Each Parquet file of INPUT_DIR is one micro-batch (``maxFilesPerTrigger=1``,
``availableNow``). Every sink step is appended to LOG as ``stage batch_id``.
With KILL_AFTER_BATCH the process group (this driver, its JVM and Python
workers) is killed with SIGKILL right after that batch committed to the
table, before Spark can record the batch in its checkpoint. Tests restart
the query with :func:`run` in their own Spark session.
"""

from __future__ import annotations

import os
import signal
import sys


def run(spark, warehouse: str, table: str, input_dir: str, checkpoint: str, log_path: str,  # noqa: ANN001
        kill_after: int | None = None) -> None:
    """Apply INPUT_DIR's files to ``table`` until none is left, logging each sink step and, at the end, ``query <id>``."""
    from lineage import streaming

    def hook(stage: str, batch_id: int) -> None:
        with open(log_path, "a") as f:
            f.write(f"{stage} {batch_id}\n")
        if stage == "committed" and batch_id == kill_after:
            os.killpg(os.getpgid(0), signal.SIGKILL)

    streaming._FAULT_HOOK = hook
    try:
        schema = "_op STRING, id BIGINT, name STRING, amount DOUBLE, seq BIGINT"
        sink = streaming.ChangelogSink(table, warehouse=warehouse, order_by="seq")
        query = (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(input_dir)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        streaming._FAULT_HOOK = None
    with open(log_path, "a") as f:
        f.write(f"query {query.id}\n")


def main() -> None:
    warehouse, table, input_dir, checkpoint, log_path = sys.argv[1:6]
    kill_after = int(sys.argv[6]) if len(sys.argv) > 6 else None
    from conftest import local_spark_builder

    spark = local_spark_builder("changelog-stream-test").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    run(spark, warehouse, table, input_dir, checkpoint, log_path, kill_after)
    spark.stop()


if __name__ == "__main__":
    main()
