"""The ``onceflow`` PySpark data source: one class Spark instantiates on the
driver and on executors, from the options the user gave.

``register(spark)`` (in ``streaming.spark``) makes ``format("onceflow")``
available; reads go to ``streaming.spark.source``, writes (streaming, and
batch ``df.write`` with mode append) to ``streaming.spark.sink``. The instance holds only its options, so it pickles.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from streaming.spark import options as opts


class OnceflowDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "onceflow"

    def schema(self) -> StructType:
        """Spark asks for the schema at ``load()``: the source's options are
        checked here too, so a wrong one fails at ``load()``, before a query
        starts (the checks that depend on stream or batch run when Spark
        asks for the reader)."""
        from streaming.spark.source import kafka_schema

        parsed = opts.parse_source_options(self.options, streaming=None)
        return kafka_schema(parsed.include_headers)

    def streamReader(self, schema: StructType):
        from streaming.spark.source import OnceflowStreamReader

        return OnceflowStreamReader(opts.parse_source_options(self.options, streaming=True), schema)

    def reader(self, schema: StructType):
        from streaming.spark.source import OnceflowBatchReader

        return OnceflowBatchReader(opts.parse_source_options(self.options, streaming=False), schema)

    def writer(self, schema: StructType, overwrite: bool):
        from streaming.spark.sink import make_batch_writer

        return make_batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from streaming.spark.sink import make_stream_writer  # the sink's own module, loaded only when writing

        return make_stream_writer(self.options, schema, overwrite)
