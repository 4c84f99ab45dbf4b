"""The netns tests' ``network`` fixture, for the nemesis run."""

from tests.netns.conftest import network, network_available

__all__ = ["network", "network_available"]
