"""A Spark streaming driver for tests/test_spark_pipeline.py and tests/test_spark_tables_kill.py, run
as a real subprocess (and killed with SIGKILL by the test): Kafka (Spark's own `kafka` source or
`dts-kafka`) -> `dts_to_blob`, `dts_to_tuple` or `dts_entries` -> `writeStream.format("datahub")`,
with a checkpoint.

    python tests/pipeline_jobs/driver.py CONFIG.json

CONFIG keys: source ("kafka" | "dts-kafka"), bootstrap, topic, maxOffsetsPerTrigger, endpoint,
project, datahub_topic, checkpoint, commitLog, trigger ("availableNow" | a processingTime such as
"1 second"), batchSize, maxRetries, jars (for the `kafka` source), kind ("blob" | "tuple" |
"database"), conf (more Spark settings, e.g. a standalone cluster's), for Tuple: table, shards; for a whole database (`dts_entries` rows, the sink's
whole-database mode): options, the sink's options besides endpoint, project, topic, batchSize,
maxRetries and commitLog (e.g. to, createTopics, shards, schemaChange, onTableError, oversized,
deadLetters). Prints "started" once the query runs and "finished" when an availableNow
query ended. Credentials come from DATAHUB_ACCESS_ID / DATAHUB_ACCESS_KEY.
"""
import json
import sys

import bridge.spark as bs


def kafka_reader(spark, cfg, streaming: bool):
    read = spark.readStream if streaming else spark.read
    if cfg["source"] == "kafka":
        reader = (read.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
                  .option("subscribe", cfg["topic"]).option("startingOffsets", "earliest"))
    else:
        reader = read.format("dts-kafka").option("brokers", cfg["bootstrap"]).option("topic", cfg["topic"])
    if streaming:
        reader = reader.option("maxOffsetsPerTrigger", str(cfg["maxOffsetsPerTrigger"]))
    return reader.load()


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    conf = {"spark.jars": cfg["jars"]} if cfg.get("jars") else {}
    conf.update(cfg.get("conf") or {})  # e.g. a standalone cluster's spark.master (tests/support/spark_cluster.py)
    spark = bs.local_session("pipeline-driver", conf)
    spark.sparkContext.setLogLevel("ERROR")
    bs.register(spark)
    stream = kafka_reader(spark, cfg, streaming=True)
    writer_options = dict(endpoint=cfg["endpoint"], project=cfg["project"], topic=cfg["datahub_topic"],
                          batchSize=cfg.get("batchSize", 5), maxRetries=cfg.get("maxRetries", 30),
                          commitLog=cfg["commitLog"])
    kind = cfg.get("kind", "blob")
    # the open tails in Spark's state store, or in files beside the checkpoint (bridge/spark/tails.py)
    state = {"state_location": cfg["state_location"]} if cfg.get("state_location") else {}
    if kind == "blob":
        out = bs.dts_to_blob(stream, **state)
    elif kind == "database":
        out = bs.dts_entries(stream, **state)
        writer_options.update(cfg["options"])
    else:
        # the table's DTS columns from a batch read of the same topic, as docs/spark.md shows
        columns = bs.table_columns(kafka_reader(spark, cfg, streaming=False), cfg["table"])
        out = bs.dts_to_tuple(stream, cfg["table"], columns=columns, positions=True, **state)
        writer_options.update(table=cfg["table"], keyColumns=",".join(c.name for c in columns if c.isKey),
                              createTopics="true", shards=cfg.get("shards", 2))
    writer = out.writeStream.format("datahub").option("checkpointLocation", cfg["checkpoint"])
    for key, value in writer_options.items():
        writer = writer.option(key, str(value))
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
