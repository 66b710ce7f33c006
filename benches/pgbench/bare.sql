\set k random(1, 2000000000)
BEGIN;
INSERT INTO tasks (title) VALUES ('task ' || :k);
COMMIT;
