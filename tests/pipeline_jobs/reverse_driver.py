"""A Spark streaming driver for tests/test_spark_datahub_reverse.py, run as a real subprocess (and
killed with SIGKILL by the test): `readStream.format("datahub")` -> `blob_to_dts` ->
`writeStream.format("dts-kafka")`, with a checkpoint.

    python tests/pipeline_jobs/reverse_driver.py CONFIG.json

CONFIG keys: endpoint, project, datahub_topic, bootstrap, topic, checkpoint, maxRecordsPerTrigger,
settle, trigger ("availableNow" | a processingTime such as "300 milliseconds"), markers (the
sink's markersTopic), conf (more Spark settings, e.g. a standalone cluster's: tests/support/spark_cluster.py).
Prints "started" once the query runs and "finished" when an availableNow query ended. Credentials
come from DATAHUB_ACCESS_ID / DATAHUB_ACCESS_KEY (on a cluster, pass them as spark.executorEnv.*).
"""
import json
import sys

import bridge.spark as bs


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    # e.g. a standalone cluster's spark.master (tests/support/spark_cluster.py)
    spark = bs.local_session("reverse-driver", cfg.get("conf") or {})
    spark.sparkContext.setLogLevel("ERROR")
    bs.register(spark)
    stream = (spark.readStream.format("datahub").option("endpoint", cfg["endpoint"])
              .option("project", cfg["project"]).option("topic", cfg["datahub_topic"])
              .option("maxRecordsPerTrigger", str(cfg["maxRecordsPerTrigger"]))
              .option("settle", str(cfg.get("settle", 0.5))).load())
    writer = (bs.blob_to_dts(stream).writeStream.format("dts-kafka")
              .option("kafka.bootstrap.servers", cfg["bootstrap"]).option("topic", cfg["topic"])
              .option("markersTopic", cfg.get("markers", "dts-bridge-spark-markers"))
              .option("checkpointLocation", cfg["checkpoint"]))
    if cfg["trigger"] == "availableNow":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=cfg["trigger"])
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
