"""A Spark job for tests/test_spark_pipeline.py (micro-batch boundaries inside Entries, every mode),
run as a subprocess so that the `kafka` source's jars are on a session of its own:

    python tests/pipeline_jobs/collect.py CONFIG.json

For each source in CONFIG["sources"] ("kafka", "dts-kafka") and each mode (FAILFAST on the clean
topic, PERMISSIVE and DROPMALFORMED on the dirty one): a streaming `dts_to_blob` with a small
`maxOffsetsPerTrigger` run to its end (availableNow) into a foreachBatch sink that keeps each
micro-batch's rows by batch id, and the batch conversion (`spark.read` of the same topic, the same
source) of the same records. Writes CONFIG["out"]: {source: {mode: {"stream": {batch id: rows},
"batch": rows, "stream_tally", "batch_tally", "checkpoint"}}}, a row being [topic, partition,
offset, entry, row, blob, error].
"""
import dataclasses
import json
import sys

import bridge.spark as bs

MODES = ("FAILFAST", "PERMISSIVE", "DROPMALFORMED")


def reader(spark, source, cfg, topic, streaming):
    read = spark.readStream if streaming else spark.read
    if source == "kafka":
        r = (read.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"]).option("subscribe", topic)
             .option("startingOffsets", "earliest"))
    else:
        r = read.format("dts-kafka").option("brokers", cfg["bootstrap"]).option("topic", topic)
    if streaming:
        r = r.option("maxOffsetsPerTrigger", str(cfg["maxOffsetsPerTrigger"]))
    return r.load()


def as_list(row):
    d = row.asDict()
    return [d["topic"], d["partition"], d["offset"], d["entry"], d["row"], d["blob"], d.get("error")]


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    conf = {"spark.jars": cfg["jars"]} if cfg.get("jars") else {}
    spark = bs.local_session("pipeline-collect", conf)
    spark.sparkContext.setLogLevel("ERROR")
    bs.register(spark)
    out: dict = {}
    running = []
    # every (source, mode) query at once: their micro-batches' fixed costs overlap
    for source in cfg["sources"]:
        for mode in cfg.get("modes", MODES):
            topic = cfg["clean"] if mode == "FAILFAST" else cfg["dirty"]
            batches: dict = {}

            def sink(df, batch_id, batches=batches):
                batches[str(batch_id)] = [as_list(r) for r in df.collect()]
            tally = bs.SparkTally(spark)
            checkpoint = f"{cfg['checkpoints']}/{source}-{mode}"
            query = (bs.dts_to_blob(reader(spark, source, cfg, topic, True), mode=mode, tally=tally)
                     .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())
            running.append((source, mode, topic, batches, tally, checkpoint, query))
    for source, mode, topic, batches, tally, checkpoint, query in running:
        query.awaitTermination()
        reference = bs.SparkTally(spark)
        batch = [as_list(r) for r in bs.dts_to_blob(reader(spark, source, cfg, topic, False), mode=mode,
                                                    tally=reference).collect()]
        out.setdefault(source, {})[mode] = dict(
            topic=topic, stream=batches, batch=batch, checkpoint=checkpoint,
            stream_tally=dataclasses.asdict(tally.value), batch_tally=dataclasses.asdict(reference.value))
        print(f"{source} {mode}: {len(batches)} micro-batches", flush=True)
    with open(cfg["out"], "w") as f:
        json.dump(out, f)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
