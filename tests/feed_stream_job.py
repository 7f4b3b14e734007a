"""A Structured Streaming query reading the change feed source (run as a child process by tests, and killed).

    python feed_stream_job.py WAREHOUSE TABLE STARTING_VERSION CHECKPOINT OUT_DIR MODE [KILL_AFTER_BATCH]

MODE ``run`` triggers every 200 ms until the process is killed; ``drain``
reads what is there with ``Trigger.AvailableNow`` and exits. The sink
(``foreachBatch``) writes micro-batch N to ``OUT_DIR/batch-N.parquet``, or,
when that file exists (Spark replays a batch whose commit it did not record),
to ``batch-N.replay-K.parquet``, so the test can check that a replay holds the
same rows. With KILL_AFTER_BATCH the process group (driver, JVM, Python
workers) is killed with SIGKILL right after that batch was written, before
Spark can record it in its checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys

MAX_VERSIONS = 3  # maxVersionsPerTrigger: more batches, more moments to be killed at


def write_batch(out: str, df, batch_id: int) -> str:  # noqa: ANN001
    """Write micro-batch ``batch_id`` to ``out`` (a replay of a batch already there beside it); returns the path."""
    import pyarrow.parquet as pq

    rows = df.toArrow()
    path = os.path.join(out, f"batch-{batch_id:05d}.parquet")
    k = 0
    while os.path.exists(path):
        k += 1
        path = os.path.join(out, f"batch-{batch_id:05d}.replay-{k}.parquet")
    pq.write_table(rows, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def main() -> None:
    warehouse, table, starting, checkpoint, out, mode = sys.argv[1:7]
    kill_after = int(sys.argv[7]) if len(sys.argv) > 7 else None
    from conftest import local_spark_builder

    import cdf.spark

    spark = local_spark_builder("feed-stream-test").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def sink(df, batch_id: int) -> None:  # noqa: ANN001
        write_batch(out, df, batch_id)
        if batch_id == kill_after:
            os.killpg(os.getpgid(0), signal.SIGKILL)

    reader = (
        spark.readStream.format(cdf.spark.register_source(spark))
        .option("table", table)
        .option("warehouse", warehouse)
        .option("startingVersion", starting)
        .option("maxVersionsPerTrigger", MAX_VERSIONS)
        .load()
    )
    writer = reader.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if mode == "drain" else writer.trigger(processingTime="200 milliseconds")
    query = writer.start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
