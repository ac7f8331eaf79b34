"""`popmq admin ... --json`: a protobuf response as plain JSON that scripts can trust.

protobuf's own MessageToDict leaves out fields holding 0, "" or false and prints 64-bit
integers as strings (its JSON mapping, for JavaScript's sake). A `jq` script then meets
`{}` for queue 0 and `"max_offset": "1"`. Here every field is present, numbers are numbers,
enums are their names, bytes are base64 (as in protobuf's mapping) and an unset message
field is null.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def message_dict(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _single(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_single(field, v) for v in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _single(field, value)
    return out


def _single(field: Any, value: Any) -> Any:  # a FieldDescriptor (python or upb)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_dict(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        number = field.enum_type.values_by_number.get(value)
        return number.name if number is not None else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


def dumps(payload: Any) -> str:
    return json.dumps(payload, indent=2, sort_keys=True)


def print_response(message: Message) -> None:
    """A response without its status (a refusal never reaches here: it exits 1)."""
    payload = message_dict(message)
    payload.pop("status", None)
    print(dumps(payload))
