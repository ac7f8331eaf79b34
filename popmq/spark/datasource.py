"""PopmqDataSource: format("popmq"), the entry point Spark instantiates from options."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from popmq.spark.batch_reader import BatchReader
from popmq.spark.multi_topic import MultiTopicBatchReader, MultiTopicStreamReader
from popmq.spark.options import OptionError, parse_read_options, parse_write_options
from popmq.spark.pop_reader import PopStreamReader
from popmq.spark.schema import check_write_schema, read_schema
from popmq.spark.stream_reader import OffsetStreamReader
from popmq.spark.writer import BatchWriter, StreamWriter


class PopmqDataSource(DataSource):
    """Read and write popmq topics: spark.read / readStream / write / writeStream."""

    @classmethod
    def name(cls) -> str:
        return "popmq"

    def schema(self) -> StructType:
        mode = str(self.options.get("mode") or "offset").strip().lower()
        return read_schema(pop=mode == "pop")

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        if options.multi_topic:
            return MultiTopicBatchReader(options)
        return BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_read_options(self.options, streaming=True)
        if options.mode == "pop":
            return PopStreamReader(options)
        if options.multi_topic:
            return MultiTopicStreamReader(options)
        return OffsetStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options, ordered = self._write_setup(schema, overwrite, streaming=False)
        return BatchWriter(options, ordered)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options, ordered = self._write_setup(schema, overwrite, streaming=True)
        return StreamWriter(options, ordered)

    def _write_setup(self, schema: StructType, overwrite: bool, streaming: bool):
        if overwrite:
            raise OptionError("topics are append-only: write with mode('append')")
        check_write_schema(schema)
        names = {field.name for field in schema.fields}
        options = parse_write_options(
            self.options, has_topic_column="topic" in names, streaming=streaming
        )
        if options.exactly_once and names & {"message_group", "delivery_timestamp"}:
            raise OptionError(
                "exactlyOnce sends transactional messages, which can have neither a "
                "'message_group' nor a 'delivery_timestamp' column"
            )
        return options, "message_group" in names
