"""The DataFrame shapes: what a read yields, what a write accepts."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

READ_FIELDS = [
    StructField("topic", StringType(), False),
    StructField("broker", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("message_id", StringType(), False),
    StructField("tag", StringType(), True),  # null when the producer set none
    StructField("keys", ArrayType(StringType(), False), False),
    StructField("properties", MapType(StringType(), StringType(), False), False),
    StructField("body", BinaryType(), False),
    StructField("born_timestamp", TimestampType(), True),
    StructField("store_timestamp", TimestampType(), True),
    StructField("delivery_attempt", IntegerType(), False),
]
READ_SCHEMA = StructType(READ_FIELDS)
# mode=pop adds the handle that acks the message (see popmq.spark.pop_ack).
POP_SCHEMA = StructType([*READ_FIELDS, StructField("receipt_handle", StringType(), False)])


def read_schema(pop: bool) -> StructType:
    return POP_SCHEMA if pop else READ_SCHEMA


# Write columns: name -> (accepted Spark types, what to say when the type is wrong).
_STRING = (StringType,)
WRITE_COLUMNS: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "body": ((BinaryType, StringType), "binary or string (strings are sent as UTF-8)"),
    "topic": (_STRING, "string"),
    "tag": (_STRING, "string"),
    "keys": ((ArrayType, StringType), "array<string> or string"),
    "properties": ((MapType,), "map<string,string>"),
    "message_group": (_STRING, "string (FIFO message group)"),
    "delivery_timestamp": ((TimestampType, LongType), "timestamp or long epoch milliseconds"),
}


def check_write_schema(schema: StructType) -> None:
    """Raises OptionError naming the column when the DataFrame cannot be written."""
    from popmq.spark.options import OptionError

    names = [field.name for field in schema.fields]
    if "body" not in names:
        raise OptionError(f"the DataFrame needs a 'body' column (binary or string); it has {names}")
    for field in schema.fields:
        spec = WRITE_COLUMNS.get(field.name)
        if spec is None:
            raise OptionError(
                f"column {field.name!r} cannot be written; the columns are "
                f"{', '.join(WRITE_COLUMNS)} (select or rename before writing)"
            )
        types, described = spec
        if not isinstance(field.dataType, types):
            raise OptionError(
                f"column {field.name!r} is {field.dataType.simpleString()}, expected {described}"
            )
        if isinstance(field.dataType, ArrayType) and not isinstance(
            field.dataType.elementType, StringType
        ):
            raise OptionError(f"column {field.name!r} must be array<string>")
        if isinstance(field.dataType, MapType) and not (
            isinstance(field.dataType.keyType, StringType)
            and isinstance(field.dataType.valueType, StringType)
        ):
            raise OptionError(f"column {field.name!r} must be map<string,string>")
