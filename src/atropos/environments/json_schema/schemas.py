"""The shipped pydantic models of `json_schema`, of varied shapes: nested objects, lists of
objects, enums (`Literal` and `Enum`), optional fields, dates, and constraints (bounds, lengths,
patterns, list sizes). Every model forbids extra keys.

`SCHEMAS` maps each model's name to it; a fixture row names its model there. A user adds their
own with `--env.schema_module my_pkg.schemas` (a module with a `SCHEMAS` dict of the same kind).

>>> sorted(SCHEMAS)[:3]
['Book', 'ContactCard', 'Event']
>>> ContactCard.model_validate({"name": "Ada", "email": "ada@example.org"}).tags
[]
"""

from __future__ import annotations

import datetime
import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SCHEMAS"]


class Strict(BaseModel):
    """A model that refuses keys it does not declare."""

    model_config = ConfigDict(extra="forbid")


class ContactCard(Strict):
    """A person's contact card."""

    name: str = Field(min_length=1, max_length=80)
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")
    phone: str | None = Field(default=None, pattern=r"^\+?[0-9 ]{7,15}$")
    tags: list[str] = Field(default_factory=list, max_length=5)


class Customer(Strict):
    """The customer who placed an order."""

    name: str = Field(min_length=1)
    country: str = Field(pattern=r"^[A-Z]{2}$", description="ISO 3166 two-letter code")


class LineItem(Strict):
    """One line of an order: a product and how many."""

    sku: str = Field(pattern=r"^[A-Z]{3}-\d{4}$")
    quantity: int = Field(ge=1, le=100)
    unit_price: float = Field(gt=0)


class Order(Strict):
    """A shop order with its lines."""

    order_id: str = Field(pattern=r"^ORD-\d{6}$")
    customer: Customer
    items: list[LineItem] = Field(min_length=1)
    status: Literal["pending", "paid", "shipped", "cancelled"]
    notes: str | None = None


class Visibility(str, enum.Enum):
    """Who may see an event."""

    public = "public"
    private = "private"


class Venue(Strict):
    """Where an event takes place."""

    name: str
    city: str
    capacity: int = Field(ge=1)


class Event(Strict):
    """A scheduled event at a venue."""

    title: str = Field(min_length=3)
    date: datetime.date
    duration_minutes: int = Field(ge=5, le=600)
    venue: Venue
    speakers: list[str] = Field(min_length=1)
    visibility: Visibility


class Ingredient(Strict):
    """One ingredient of a recipe and its amount."""

    name: str
    amount: float = Field(gt=0)
    unit: Literal["g", "kg", "ml", "l", "tsp", "tbsp", "cup", "piece"]


class Recipe(Strict):
    """A cooking recipe."""

    name: str
    servings: int = Field(ge=1, le=20)
    ingredients: list[Ingredient] = Field(min_length=1)
    steps: list[str] = Field(min_length=1)
    vegetarian: bool
    prep_minutes: int = Field(ge=0)


class TLS(Strict):
    """A server's TLS settings."""

    cert_path: str
    key_path: str
    min_version: Literal["1.2", "1.3"]


class ServerConfig(Strict):
    """A web server's settings."""

    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    mode: Literal["development", "staging", "production"]
    workers: int = Field(ge=1, le=64)
    tls: TLS | None = None
    allowed_origins: list[str] = Field(default_factory=list)


class Genre(str, enum.Enum):
    """A book's genre."""

    fiction = "fiction"
    history = "history"
    science = "science"
    poetry = "poetry"
    biography = "biography"


class Author(Strict):
    """One author of a book."""

    first_name: str
    last_name: str


class Book(Strict):
    """A book in a catalogue."""

    isbn: str = Field(pattern=r"^97[89]\d{10}$")
    title: str = Field(min_length=1)
    authors: list[Author] = Field(min_length=1)
    year: int = Field(ge=1450, le=2030)
    genres: list[Genre] = Field(min_length=1, max_length=3)
    rating: float | None = Field(default=None, ge=0, le=5)


class Wind(Strict):
    """Wind speed and direction."""

    speed_kmh: float = Field(ge=0)
    direction: Literal["N", "NE", "E", "SE", "S", "SW", "W", "NW"]


class Alert(Strict):
    """A weather alert."""

    level: Literal["advisory", "watch", "warning"]
    message: str = Field(min_length=1)


class WeatherReport(Strict):
    """An observation from a weather station."""

    station_id: str = Field(pattern=r"^[A-Z]{4}$")
    observed_at: datetime.datetime
    temperature_c: float = Field(ge=-90, le=60)
    humidity: int = Field(ge=0, le=100)
    conditions: Literal["clear", "cloudy", "rain", "snow", "fog", "storm"]
    wind: Wind
    alerts: list[Alert] = Field(default_factory=list)


class Owner(Strict):
    """The user who owns a playlist."""

    username: str = Field(pattern=r"^[a-z0-9_]{3,20}$")
    premium: bool


class Track(Strict):
    """One track of a playlist."""

    title: str
    artist: str
    seconds: int = Field(ge=1, le=3600)
    explicit: bool = False


class Playlist(Strict):
    """A music playlist."""

    name: str = Field(min_length=1, max_length=60)
    owner: Owner
    tracks: list[Track] = Field(min_length=1, max_length=50)
    public: bool


SCHEMAS: dict[str, type[BaseModel]] = {
    model.__name__: model
    for model in (ContactCard, Order, Event, Recipe, ServerConfig, Book, WeatherReport, Playlist)
}
