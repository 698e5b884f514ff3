"""Above both servers: the topology that describes a deployment, and Polar in one process."""
