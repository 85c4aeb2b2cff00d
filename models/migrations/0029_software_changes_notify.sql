-- A node's software version (the largest version of its software
-- deployments, what an agent's software long poll compares) changes with
-- every deployment created, given a new round, ended or removed. Only a
-- round's start and end announced it (pg_notify in their statements), so
-- every waiting poll also read the version again every 15 s: for a
-- thousand idle agents, 67 queries a second and a sixth of what an idle
-- site cost the API. Every such change now wakes the node's software poll
-- ("s:<node id>" on anneal_work; Postgres folds it into the statement's own
-- notification when the payload is the same), and the polls look again only
-- when woken or when their wait ends.
CREATE FUNCTION anneal_software_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP <> 'INSERT' AND OLD.node_id IS NOT NULL THEN
    PERFORM pg_notify('anneal_work', 's:' || OLD.node_id);
  END IF;
  IF TG_OP <> 'DELETE' AND NEW.node_id IS NOT NULL THEN
    PERFORM pg_notify('anneal_work', 's:' || NEW.node_id);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER software_deployments_wake
AFTER INSERT OR DELETE OR UPDATE OF version, node_id ON software_deployments
FOR EACH ROW EXECUTE FUNCTION anneal_software_changed();
