"""What the fake service can host: images with prioritised tags and exposed ports, locations and their ips."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from archiver.fake.errors import FakeConfigError


@dataclass(frozen=True, slots=True)
class PortSpec:
    """One port the image exposes inside its container."""

    container: int
    protocol: str  # "tcp" | "udp"

    @property
    def key(self) -> str:
        """The ``port`` map key of the wire format, e.g. ``7777/udp``."""
        return f"{self.container}/{self.protocol}"


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """A hostable image: its tags with priorities (highest runs when no version is asked for)."""

    name: str
    tags: Mapping[str, int]
    ports: tuple[PortSpec, ...] = (PortSpec(7777, "udp"),)
    #: Locations that can host it; None means every location of the catalogue.
    locations: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.tags:
            raise FakeConfigError(f"image {self.name!r} needs at least one tag")

    @property
    def default_tag(self) -> str:
        """The tag with the highest priority (ties: the last one listed)."""
        best = max(self.tags.values())
        return [t for t, p in self.tags.items() if p == best][-1]


@dataclass(frozen=True, slots=True)
class Catalogue:
    """Images and locations (location id → ips); ``capacity`` caps active sessions per location."""

    images: Mapping[str, ImageSpec]
    locations: Mapping[str, tuple[str, ...]]
    capacity: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        for image in self.images.values():
            for loc in image.locations or ():
                if loc not in self.locations:
                    raise FakeConfigError(f"image {image.name!r} names unknown location {loc!r}")
        for loc, ips in self.locations.items():
            if not ips:
                raise FakeConfigError(f"location {loc!r} needs at least one ip")

    def image_locations(self, image: str) -> tuple[str, ...]:
        """Locations that can host ``image`` (empty for an unknown image)."""
        spec = self.images.get(image)
        if spec is None:
            return ()
        return spec.locations if spec.locations is not None else tuple(self.locations)


def default_catalogue() -> Catalogue:
    """``demo-game`` 1.0.0 and 1.1.0 (highest) in eu-west-1, us-east-1 and ap-southeast-1."""
    return Catalogue(
        images=MappingProxyType({"demo-game": ImageSpec("demo-game", MappingProxyType({"1.0.0": 1, "1.1.0": 2}))}),
        # Documentation address ranges (RFC 5737): never routable, fine for a fake.
        locations=MappingProxyType(
            {
                "eu-west-1": ("203.0.113.10", "203.0.113.11"),
                "us-east-1": ("198.51.100.20", "198.51.100.21"),
                "ap-southeast-1": ("192.0.2.30", "192.0.2.31"),
            }
        ),
    )
